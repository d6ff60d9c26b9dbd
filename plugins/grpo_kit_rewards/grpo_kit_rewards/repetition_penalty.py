"""repetition_penalty: a penalty in [max_penalty, 0] that grows with the share of repeated n-grams.

"Demystifying Long Chain-of-Thought Reasoning in LLMs", appendix C.2 (https://arxiv.org/abs/2502.03373), as
open-r1's `get_repetition_penalty_reward` (https://github.com/huggingface/open-r1) and TRL's
(https://huggingface.co/docs/trl/rewards) compute it:

    penalty = (1 - distinct n-grams / all n-grams) * max_penalty

A completion with fewer than `ngram_size` units scores 0.0. The units are the completion's tokens (`unit=tokens`,
TRL's choice) or its lower-cased whitespace-separated words (`unit=words`, open-r1's choice).
"""

from grpo_kit_rewards.text import completion_text

UNITS = ("tokens", "words")


class RepetitionPenalty:
    def __init__(self, config):
        if config.max_penalty > 0:
            raise ValueError(f"reward.repetition_penalty.max_penalty must be <= 0, got {config.max_penalty}.")
        if config.ngram_size < 1:
            raise ValueError(f"reward.repetition_penalty.ngram_size must be >= 1, got {config.ngram_size}.")
        if config.unit not in UNITS:
            raise ValueError(f"reward.repetition_penalty.unit must be one of {', '.join(UNITS)}, got {config.unit!r}.")
        self.ngram_size, self.max_penalty, self.unit = config.ngram_size, config.max_penalty, config.unit

    def __call__(self, prompts, completions, completion_ids, **columns) -> list[float]:
        if self.unit == "tokens":
            return [self._penalty(ids) for ids in completion_ids]
        return [self._penalty(completion_text(c).lower().split()) for c in completions]

    def _penalty(self, units: list) -> float:
        ngrams = list(zip(*(units[i:] for i in range(self.ngram_size))))
        repeated = 1 - len(set(ngrams)) / len(ngrams) if ngrams else 0.0
        return repeated * self.max_penalty if repeated else 0.0  # 0.0, not -0.0, when nothing repeats
