"""gdpo: normalise each reward within its group first, then take the weighted sum, then normalise the batch.

GDPO, Group reward-Decoupled Normalization Policy Optimization (https://arxiv.org/abs/2601.05242): summing
raw rewards before normalising lets the reward with the largest spread drown the others; normalising each
one in its group first keeps every reward's signal.
"""

from grpo_kit.contract.advantages import nanstd


class DecoupledAdvantage:
    def __call__(self, rewards_per_func, weights, num_generations):
        num_rewards = rewards_per_func.shape[1]
        groups = rewards_per_func.view(-1, num_generations, num_rewards)  # (N / G, G, K)
        mean = groups.nanmean(dim=1, keepdim=True)
        std = nanstd(groups, dim=1, keepdim=True)
        normalised = ((groups - mean) / (std + 1e-4)).view(-1, num_rewards)  # (N, K)
        rewards = (normalised * weights.to(normalised.device)).nansum(dim=1)
        rewards = rewards.masked_fill(rewards_per_func.isnan().all(dim=1), float("nan"))
        return (rewards - rewards.nanmean()) / (nanstd(rewards) + 1e-4)
