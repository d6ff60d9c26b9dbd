"""calculator: exact integer arithmetic, for tasks a small model gets wrong by itself.

`python -m grpo_kit +loss=dapo +reward=accuracy +environment=calculator` trains the embedded tool-use model
(grpo_kit/embedded/tool_use.py) to call `add` on 2-digit sums instead of guessing. Each completion gets its own
calculator; `reset` starts it afresh and counts the calls it answers, which a reward or a test may read.
"""

from grpo_kit_environments.configs import CalculatorConfig


class Calculator:
    def __init__(self, config: CalculatorConfig):
        self.max_operand = config.max_operand
        self.calls = 0

    def reset(self, **row) -> None:
        self.calls = 0

    def add(self, a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first number.
            b: The second number.
        """
        return self._answer(a, b, a + b)

    def multiply(self, a: int, b: int) -> int:
        """Multiply two integers.

        Args:
            a: The first number.
            b: The second number.
        """
        return self._answer(a, b, a * b)

    def _answer(self, a: int, b: int, result: int) -> int:
        if max(abs(a), abs(b)) > self.max_operand:
            raise ValueError(f"operands up to {self.max_operand} only")
        self.calls += 1
        return result
