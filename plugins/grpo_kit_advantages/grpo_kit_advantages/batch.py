"""batch: centred on the group mean like `group`, but scaled by the standard deviation of the whole batch.

"Tricks or Traps? A Deep Dive into RL for LLM Reasoning" (Liu et al. 2025, "Lite PPO"),
https://arxiv.org/abs/2508.08221: group-level means with batch-level std give more robust shaping when
many groups have (almost) equal rewards.
"""

from grpo_kit.contract.advantages import nanstd, weighted_rewards


class BatchAdvantage:
    def __call__(self, rewards_per_func, weights, num_generations):
        rewards = weighted_rewards(rewards_per_func, weights)  # (N,)
        groups = rewards.view(-1, num_generations)
        centred = (groups - groups.nanmean(dim=1, keepdim=True)).view(-1)
        return centred / (nanstd(rewards) + 1e-4)
