"""Every advantage estimator on small reward matrices whose expected values are worked out by hand."""

import math

import pytest
import torch

from grpo_kit_advantages.batch import BatchAdvantage
from grpo_kit_advantages.gdpo import DecoupledAdvantage
from grpo_kit_advantages.group import GroupAdvantage
from grpo_kit_advantages.none import CentredAdvantage
from grpo_kit_advantages.rloo import LeaveOneOutAdvantage

NAN = float("nan")
# Two groups of two, two rewards weighted 1.0 and 0.5: weighted rewards 1.0, 0.5 | 1.5, 1.5.
REWARDS = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [1.0, 1.0]])
WEIGHTS = torch.tensor([1.0, 0.5])
GROUP_STD = math.sqrt(0.125)  # sample std of (1.0, 0.5)


def test_group_scales_by_the_group_std():
    advantages = GroupAdvantage()(REWARDS, WEIGHTS, num_generations=2)
    a = 0.25 / (GROUP_STD + 1e-4)
    assert advantages.tolist() == pytest.approx([a, -a, 0.0, 0.0], rel=1e-6)


def test_batch_scales_by_the_batch_std():
    advantages = BatchAdvantage()(REWARDS, WEIGHTS, num_generations=2)
    # batch of 1.0, 0.5, 1.5, 1.5: mean 1.125, squares 0.015625 + 0.390625 + 2 * 0.140625 = 0.6875, / 3
    a = 0.25 / (math.sqrt(0.6875 / 3) + 1e-4)
    assert advantages.tolist() == pytest.approx([a, -a, 0.0, 0.0], rel=1e-6)


def test_none_only_centres():
    advantages = CentredAdvantage()(REWARDS, WEIGHTS, num_generations=2)
    assert advantages.tolist() == pytest.approx([0.25, -0.25, 0.0, 0.0])


def test_rloo_uses_the_other_completions_as_baseline():
    rewards = torch.tensor([[1.0], [0.0], [0.0], [2.0], [2.0], [2.0]])
    advantages = LeaveOneOutAdvantage()(rewards, torch.tensor([1.0]), num_generations=3)
    # group 1: 1 - (0 + 0)/2, 0 - (1 + 0)/2, 0 - 1/2; group 2: all equal
    assert advantages.tolist() == pytest.approx([1.0, -0.5, -0.5, 0.0, 0.0, 0.0])


def test_gdpo_normalises_each_reward_in_its_group_first():
    advantages = DecoupledAdvantage()(REWARDS, WEIGHTS, num_generations=2)
    # group 1, reward 1: (1, 0) -> +-0.5 / (std 0.7071 + 1e-4); reward 2: (0, 1) -> -+ the same
    z = 0.5 / (math.sqrt(0.5) + 1e-4)
    summed = torch.tensor([z - 0.5 * z, -z + 0.5 * z, 0.0, 0.0])  # group 2 has zero spread: 0
    expected = (summed - summed.mean()) / (summed.std() + 1e-4)
    torch.testing.assert_close(advantages, expected)


@pytest.mark.parametrize(
    "estimator", [GroupAdvantage, BatchAdvantage, CentredAdvantage, LeaveOneOutAdvantage, DecoupledAdvantage]
)
def test_an_unscorable_completion_does_not_move_its_group_baseline(estimator):
    with_unscorable = torch.tensor([[1.0], [0.0], [0.0], [1.0], [1.0], [NAN]])
    advantages = estimator()(with_unscorable, torch.tensor([1.0]), num_generations=3)
    assert advantages[5].isnan()  # the core turns it into 0
    # the second group's baseline ignores the unscorable completion: two completions, rewards 1 and 1
    if estimator is not DecoupledAdvantage and estimator is not BatchAdvantage:
        assert advantages[3:5].tolist() == pytest.approx([0.0, 0.0], abs=1e-6)


def test_a_reward_with_no_opinion_is_left_out_of_the_weighted_sum():
    rewards = torch.tensor([[1.0, NAN], [0.0, 1.0]])
    # weighted: 1.0 (the None counts as nothing) and 0.5
    advantages = CentredAdvantage()(rewards, torch.tensor([1.0, 0.5]), num_generations=2)
    assert advantages.tolist() == pytest.approx([0.25, -0.25])
