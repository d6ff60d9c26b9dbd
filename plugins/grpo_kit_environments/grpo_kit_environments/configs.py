"""The environments' options (kept apart from their code, so that composing a run imports none of it)."""

from dataclasses import dataclass


@dataclass
class CalculatorConfig:
    max_operand: int = 10**12  # larger operands are refused with an error the model sees (and a tool failure)
