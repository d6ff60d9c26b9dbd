"""The rollout corrections' options (`rollout_correction.min=...`), apart from the corrections, which compute with
torch, so that listing the plugins and composing a run read them without importing torch."""

from dataclasses import dataclass


@dataclass
class CorrectionConfig:
    min: float | None = None  # lower bound on the ratio; None: unbounded below
    max: float | None = 3.0  # upper bound on the ratio; None: unbounded above
