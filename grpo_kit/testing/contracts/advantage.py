"""The advantage suite (grpo_kit/contract/kinds.py: Advantage)."""

import math
from typing import ClassVar

import torch

from grpo_kit.testing.contracts.checks import assert_close
from grpo_kit.testing.contracts.plugin import PluginContract


class AdvantageContract(PluginContract):
    """An advantage estimator (kinds.py: Advantage): (N,) advantages from the (N, K) rewards, NaN = None."""

    kind = "advantage"
    num_generations: ClassVar[int] = 4

    def rewards(self) -> torch.Tensor:  # (3 groups x num_generations, 2 rewards)
        generator = torch.Generator().manual_seed(0)
        rewards = torch.rand(3 * self.num_generations, 2, generator=generator).round()
        rewards[: self.num_generations, 0] = torch.arange(self.num_generations, dtype=torch.float)  # spread
        rewards[self.num_generations : 2 * self.num_generations] = torch.tensor([0.5, 1.0])  # all equal
        return rewards

    WEIGHTS = torch.tensor([1.0, 0.5])

    def test_one_advantage_per_completion(self, plugin):
        advantages = plugin(self.rewards(), self.WEIGHTS, self.num_generations)
        assert isinstance(advantages, torch.Tensor) and advantages.shape == (3 * self.num_generations,), (
            f"expected shape ({3 * self.num_generations},), got {getattr(advantages, 'shape', type(advantages))}"
        )
        assert advantages.is_floating_point() and torch.isfinite(advantages).all(), f"advantages {advantages}"

    def test_a_group_with_equal_rewards_gets_zero(self, plugin):
        advantages = plugin(self.rewards(), self.WEIGHTS, self.num_generations)
        equal_group = advantages[self.num_generations : 2 * self.num_generations]
        assert_close(
            equal_group,
            torch.zeros_like(equal_group),
            "a group whose rewards are all equal teaches nothing",
            atol=1e-6,
            rtol=0,
        )

    def test_unscored_completions(self, plugin):
        rewards = self.rewards()
        rewards[1] = math.nan  # every reward said None: NaN or 0 (the core sets it to 0)
        rewards[2 * self.num_generations, 1] = math.nan  # one reward said None: still a number
        advantages = plugin(rewards, self.WEIGHTS, self.num_generations)
        assert advantages[1].isnan() or advantages[1] == 0, f"an unscorable completion got advantage {advantages[1]}"
        others = torch.cat([advantages[:1], advantages[2:]])
        assert torch.isfinite(others).all(), f"an unscorable completion made others non-finite: {advantages}"

    def test_a_higher_reward_never_gets_a_lower_advantage(self, plugin):
        size = self.num_generations
        shuffled = torch.randperm(size, generator=torch.Generator().manual_seed(0)).float()
        rewards = torch.cat([shuffled, -shuffled]).unsqueeze(1)  # two groups of distinct rewards, one reward
        advantages = plugin(rewards, torch.ones(1), size)
        for start in (0, size):
            group = slice(start, start + size)
            ordered = advantages[group][rewards[group, 0].argsort()]  # by increasing reward
            assert (ordered[1:] >= ordered[:-1] - 1e-6).all(), f"rewards {rewards.view(-1)}: advantages {advantages}"
        assert advantages.abs().sum() > 0, "groups with different rewards got no advantage at all"
