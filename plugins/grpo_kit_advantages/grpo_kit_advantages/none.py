"""none: each completion's reward minus its group's mean, with no scaling.

Dr. GRPO (Liu et al. 2025), https://arxiv.org/abs/2503.20783, section 3.1: dividing by the group's std weighs
prompts that are too easy or too hard more heavily (a question-level difficulty bias); leaving it out removes it.
"""

from grpo_kit.contract.advantages import weighted_rewards


class CentredAdvantage:
    def __call__(self, rewards_per_func, weights, num_generations):
        groups = weighted_rewards(rewards_per_func, weights).view(-1, num_generations)
        return (groups - groups.nanmean(dim=1, keepdim=True)).view(-1)
