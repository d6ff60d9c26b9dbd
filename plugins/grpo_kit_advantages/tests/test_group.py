import pytest
import torch

from grpo_kit_advantages.group import GroupAdvantage


def test_group_advantage_by_hand():
    # Two groups of two; rewards are 1.0 * r1 + 0.5 * r2.
    rewards_per_func = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [1.0, 1.0]])
    advantages = GroupAdvantage(None)(rewards_per_func, torch.tensor([1.0, 0.5]), num_generations=2)
    # group 1: rewards 1.0 and 0.5, mean 0.75, sample std 0.353553 -> +-0.25 / (0.353553 + 1e-4)
    expected = 0.25 / (0.5**0.5 / 2 + 1e-4)
    assert advantages.tolist() == pytest.approx([expected, -expected, 0.0, 0.0], rel=1e-5)


def test_none_counts_as_zero_in_the_weighted_sum():
    rewards_per_func = torch.tensor([[1.0], [float("nan")]])
    advantages = GroupAdvantage(None)(rewards_per_func, torch.tensor([1.0]), num_generations=2)
    assert advantages[0] > 0 > advantages[1]
