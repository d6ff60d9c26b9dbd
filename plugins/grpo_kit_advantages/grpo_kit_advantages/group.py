"""group: each completion's reward minus its group's mean, divided by the group's standard deviation.

DeepSeekMath (Shao et al. 2024), https://arxiv.org/abs/2402.03300, section 4.1.2 (outcome supervision):
A_i = (r_i - mean(r)) / std(r) over the num_generations completions of one prompt; 1e-4 keeps a group whose
rewards are all equal at advantage 0 instead of dividing by zero.
"""

from grpo_kit.contract.advantages import nanstd, weighted_rewards


class GroupAdvantage:
    def __call__(self, rewards_per_func, weights, num_generations):
        groups = weighted_rewards(rewards_per_func, weights).view(-1, num_generations)  # (N / G, G)
        centred = groups - groups.nanmean(dim=1, keepdim=True)
        return (centred / (nanstd(groups, dim=1, keepdim=True) + 1e-4)).view(-1)
