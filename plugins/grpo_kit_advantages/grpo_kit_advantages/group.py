"""group: each completion's reward minus its group's mean, divided by the group's standard deviation.

DeepSeekMath (Shao et al. 2024), https://arxiv.org/abs/2402.03300, section 4.1.2 (outcome supervision):
A_i = (r_i - mean(r)) / std(r) over the num_generations completions of one prompt; 1e-4 keeps a group whose
rewards are all equal at advantage 0 instead of dividing by zero.
"""

import torch


class GroupAdvantage:
    def __init__(self, config):
        pass

    def __call__(self, rewards_per_func, weights, num_generations):
        rewards = (rewards_per_func * weights).nansum(dim=1)  # (N,)
        groups = rewards.view(-1, num_generations)  # (N / G, G)
        mean = groups.mean(dim=1, keepdim=True)
        std = groups.std(dim=1, keepdim=True)
        return ((groups - mean) / (std + 1e-4)).view(-1)
