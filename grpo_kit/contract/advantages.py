"""Helpers for advantage plugins: the weighted reward of each completion, and a standard deviation that skips NaN.

A completion that every reward scored None is unscorable: its weighted reward is NaN, so nan-aware statistics
leave it out of its group's baseline, and the core sets its advantage to 0 afterwards.
"""

import torch


def weighted_rewards(rewards_per_func: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:  # (N,)
    """Sum of weight x reward over the rewards that had an opinion; NaN where none had."""
    rewards = (rewards_per_func * weights.to(rewards_per_func.device)).nansum(dim=1)
    return rewards.masked_fill(rewards_per_func.isnan().all(dim=1), float("nan"))


def nanstd(values: torch.Tensor, dim: int | None = None, keepdim: bool = False) -> torch.Tensor:
    """The sample standard deviation (Bessel-corrected) of the non-NaN values; NaN with fewer than two."""
    if dim is None:
        values, dim = values.flatten(), 0
    present = ~values.isnan()
    count = present.sum(dim=dim, keepdim=True)
    mean = values.nanmean(dim=dim, keepdim=True)
    squares = ((values - mean) ** 2).nansum(dim=dim, keepdim=True)
    variance = torch.where(count > 1, squares / (count - 1).clamp(min=1), torch.full_like(squares, float("nan")))
    std = variance.sqrt()
    return std if keepdim else std.squeeze(dim)
