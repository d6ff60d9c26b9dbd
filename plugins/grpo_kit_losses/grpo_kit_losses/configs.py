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
    # The gate is sigmoid(tau * (r - 1)) * 4 / tau: a larger temperature tau fades it faster as r leaves 1.
    temperature_pos: float = 1.0  # tau where the advantage is positive
    temperature_neg: float = 1.05  # tau where the advantage is zero or negative; SAPO makes it the larger (sharper)


@dataclass
class VESPOConfig:
    # phi(w) = exp(lambda) * w^k * exp(-lambda * w) scales each sequence by its importance weight w; phi(1) = 1.
    k_pos: float = 2.0  # k where the advantage is >= 0: larger fades sequences with w < 1 faster
    lambda_pos: float = 3.0  # lambda where the advantage is >= 0: larger fades sequences with w > 1 faster
    k_neg: float = 3.0  # k where the advantage is negative
    lambda_neg: float = 2.0  # lambda where the advantage is negative
