"""Scoring: every selected reward function on every completion, as an (N, K) matrix with NaN for "no opinion"."""

import asyncio
import inspect
import math
from collections.abc import Callable

import torch


class RewardError(Exception):
    """A reward function returned something the run cannot use."""


def score(
    rewards: dict[str, Callable], prompts: list, completions: list, completion_ids: list[list[int]], columns: dict
) -> torch.Tensor:  # (N, K)
    scores = []
    for name, function in rewards.items():
        values = function(prompts=prompts, completions=completions, completion_ids=completion_ids, **columns)
        if inspect.isawaitable(values):
            values = asyncio.run(values)
        scores.append(_checked(name, values, len(completions)))
    return torch.tensor(scores, dtype=torch.float32).T.reshape(len(completions), len(rewards))


def _checked(name: str, values, expected: int) -> list[float]:
    if not isinstance(values, (list, tuple)) or len(values) != expected:
        size = len(values) if hasattr(values, "__len__") else type(values).__name__
        raise RewardError(f"Reward {name!r} returned {size} values for {expected} completions: one each is needed.")
    checked = []
    for index, value in enumerate(values):
        if value is None:
            checked.append(math.nan)
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise RewardError(
                f"Reward {name!r} returned {value!r} for completion {index}: use a finite number, or None for no opinion."
            )
        else:
            checked.append(float(value))
    return checked
