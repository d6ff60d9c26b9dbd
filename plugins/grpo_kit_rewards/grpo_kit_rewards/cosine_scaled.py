"""cosine_scaled: correctness scaled by length on a cosine schedule, so that short right answers earn most.

"Demystifying Long Chain-of-Thought Reasoning in LLMs", appendix C.1 (https://arxiv.org/abs/2502.03373), with the
options of open-r1's `get_cosine_scaled_reward` (https://github.com/huggingface/open-r1) and the behaviour of TRL's
(https://huggingface.co/docs/trl/rewards): the length is the completion's token count, capped at `max_len` (cosine
would rise again past it), and an unparsable gold answer gives None. With L = min(len / max_len, 1):

    reward = lo + (hi - lo) * (1 + cos(pi * L)) / 2

where (lo, hi) = (min_value_correct, max_value_correct) for a right answer, so shorter is better, and
(max_value_wrong, min_value_wrong) for a wrong one, so a longer wrong answer is punished less (it explores).
"""

import math

from grpo_kit_rewards.accuracy import gold_answers
from grpo_kit_rewards.math_answers import is_correct
from grpo_kit_rewards.plain_answers import plain_verdict
from grpo_kit_rewards.text import completion_text


class CosineScaled:
    cpu_heavy = True  # sympy holds the GIL: the Scorer runs this in its worker processes

    def __init__(self, config):
        if not isinstance(config.max_len, int) or config.max_len <= 0:
            raise ValueError(
                f"reward.cosine_scaled.max_len must be a positive number of tokens, got {config.max_len!r} "
                "(in a composed run it defaults to generation.max_completion_length)."
            )
        self.solution_column, self.max_len = config.solution_column, config.max_len
        self.correct = (config.min_value_correct, config.max_value_correct)
        self.wrong = (config.max_value_wrong, config.min_value_wrong)

    @property
    def required_columns(self) -> list[str]:
        return [self.solution_column]

    def __call__(self, prompts, completions, completion_ids, **columns) -> list[float | None]:
        solutions = gold_answers(columns, self.solution_column, "cosine_scaled")
        return [
            self._scaled(is_correct(completion_text(completion), gold), len(ids))
            for completion, ids, gold in zip(completions, completion_ids, solutions)
        ]

    def quick_scores(self, prompts, completions, completion_ids, **columns) -> dict[int, float]:
        """The scores that need no math-verify (plain_answers.py), which the Scorer gives without its workers."""
        solutions = gold_answers(columns, self.solution_column, "cosine_scaled")
        verdicts = [plain_verdict(completion_text(c), gold) for c, gold in zip(completions, solutions)]
        return {row: self._scaled(v, len(completion_ids[row])) for row, v in enumerate(verdicts) if v is not None}

    def _scaled(self, correct: float | None, length: int) -> float | None:
        if correct is None:  # the gold answer cannot be parsed
            return None
        low, high = self.correct if correct else self.wrong
        progress = min(length / self.max_len, 1.0)
        return low + (high - low) * (1.0 + math.cos(math.pi * progress)) / 2
