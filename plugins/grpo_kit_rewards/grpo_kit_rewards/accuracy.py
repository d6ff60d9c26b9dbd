"""accuracy: 1.0 when the completion's final answer equals the gold answer, else 0.0; None when the gold is unparsable.

The verifiable-reward check of DeepSeek-R1 (https://arxiv.org/abs/2501.12948), as TRL's `accuracy_reward`
(https://huggingface.co/docs/trl/rewards) computes it with math-verify, except that a plain answer such as "12"
counts too (TRL's own reward reads only LaTeX answers). The gold answers come from a dataset column, `solution`
unless `solution_column` names another.
"""

from grpo_kit_rewards.math_answers import is_correct
from grpo_kit_rewards.plain_answers import plain_verdict
from grpo_kit_rewards.text import completion_text


class Accuracy:
    cpu_heavy = True  # sympy holds the GIL: the Scorer runs this in its worker processes

    def __init__(self, config):
        self.solution_column = config.solution_column

    @property
    def required_columns(self) -> list[str]:
        return [self.solution_column]

    def __call__(self, prompts, completions, completion_ids, **columns) -> list[float | None]:
        solutions = gold_answers(columns, self.solution_column, "accuracy")
        return [is_correct(completion_text(c), gold) for c, gold in zip(completions, solutions)]

    def quick_scores(self, prompts, completions, completion_ids, **columns) -> dict[int, float]:
        """The scores that plain text settles (plain_answers.py), which the Scorer gives without its workers."""
        solutions = gold_answers(columns, self.solution_column, "accuracy")
        verdicts = [plain_verdict(completion_text(c), gold) for c, gold in zip(completions, solutions)]
        return {row: verdict for row, verdict in enumerate(verdicts) if verdict is not None}


def gold_answers(columns: dict, column: str, reward: str) -> list[str]:
    if column not in columns:
        raise ValueError(
            f"The {reward} reward reads the gold answers from a dataset column named {column!r}, which this dataset "
            f"lacks (its columns: {', '.join(columns) or 'none'}). Set reward.{reward}.solution_column to the "
            "column that holds them."
        )
    return [str(gold) for gold in columns[column]]
