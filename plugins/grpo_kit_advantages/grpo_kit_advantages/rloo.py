"""rloo: each completion's reward minus the mean reward of the other completions of its prompt.

REINFORCE Leave-One-Out (Kool et al. 2019, https://openreview.net/forum?id=r1lgTGL5DE; for LLMs Ahmadian et
al. 2024, https://arxiv.org/abs/2402.14740): the baseline excludes the sample itself, so it is unbiased.
A_i = r_i - (sum_j r_j - r_i) / (G' - 1), where G' counts the group's scorable completions.
"""

import torch

from grpo_kit.contract.advantages import weighted_rewards


class LeaveOneOutAdvantage:
    def __call__(self, rewards_per_func, weights, num_generations):
        groups = weighted_rewards(rewards_per_func, weights).view(-1, num_generations)  # (N / G, G)
        scorable = (~groups.isnan()).sum(dim=1, keepdim=True)
        others = groups.nansum(dim=1, keepdim=True) - groups
        baseline = others / (scorable - 1).clamp(min=1)
        return torch.where(scorable > 1, groups - baseline, torch.zeros_like(groups)).view(-1)
