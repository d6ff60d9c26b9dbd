"""reasoning_accuracy: accuracy of the answer after the reasoning; 0.0 when the reasoning never ends.

TRL's `reasoning_accuracy_reward` (https://huggingface.co/docs/trl/rewards): only the text after the last
occurrence of the first reasoning delimiter found (`</think>` by default) is checked, so an answer buried in the
reasoning earns nothing, and a completion with no delimiter scores 0.0 rather than None to penalise reasoning
that is cut off. An unparsable gold answer gives None, as in accuracy.
"""

from grpo_kit_rewards.accuracy import gold_answers
from grpo_kit_rewards.math_answers import is_correct
from grpo_kit_rewards.plain_answers import plain_verdict
from grpo_kit_rewards.text import completion_text


class ReasoningAccuracy:
    cpu_heavy = True  # sympy holds the GIL: the Scorer runs this in its worker processes

    def __init__(self, config):
        self.solution_column = config.solution_column
        self.reasoning_delimiters = list(config.reasoning_delimiters)

    @property
    def required_columns(self) -> list[str]:
        return [self.solution_column]

    def __call__(self, prompts, completions, completion_ids, **columns) -> list[float | None]:
        solutions = gold_answers(columns, self.solution_column, "reasoning_accuracy")
        return [self._score(completion_text(c), gold, is_correct) for c, gold in zip(completions, solutions)]

    def quick_scores(self, prompts, completions, completion_ids, **columns) -> dict[int, float]:
        """The scores that need no math-verify (plain_answers.py), which the Scorer gives without its workers."""
        solutions = gold_answers(columns, self.solution_column, "reasoning_accuracy")
        scores = [self._score(completion_text(c), gold, plain_verdict) for c, gold in zip(completions, solutions)]
        return {row: score for row, score in enumerate(scores) if score is not None}

    def _score(self, text: str, gold: str, verdict) -> float | None:
        delimiter = next((d for d in self.reasoning_delimiters if d in text), None)
        if delimiter is None:
            return 0.0
        return verdict(text.split(delimiter)[-1], gold)
