"""The built-in losses' options: each field is a `loss.FIELD=...` option, with its default.

They live apart from the losses, which compute with torch, so that listing the plugins and composing a run read
them without importing torch.
"""

from dataclasses import dataclass


@dataclass
class ClippedConfig:
    epsilon: float = 0.2  # lower clip: the ratio is kept above 1 - epsilon where the advantage is negative
    epsilon_high: float | None = None  # upper clip; None uses epsilon (DAPO recommends 0.28)
    delta: float | None = None  # caps the unclipped ratio too; INTELLECT-2 recommends > 1 + epsilon


@dataclass
class CISPOConfig:
    epsilon_high: float = 5.0  # eps_max: the importance weight's upper bound


@dataclass
class SAPOConfig:
    temperature_pos: float = 1.0
    temperature_neg: float = 1.05


@dataclass
class VESPOConfig:
    k_pos: float = 2.0
    lambda_pos: float = 3.0
    k_neg: float = 3.0
    lambda_neg: float = 2.0
