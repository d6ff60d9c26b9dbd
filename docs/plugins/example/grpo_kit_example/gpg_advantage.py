"""gpg: Group Policy Gradient's advantage, the reward minus its group's mean, scaled by the correction factor alpha.

GPG (Chu et al. 2025), https://arxiv.org/abs/2504.02546. The advantage of completion i of a group is

    A_i = alpha * (r_i - mean(r_group)) / F_norm

F_norm is 1 unless `normalize_by_std` divides by the group's standard deviation as GRPO does; the authors'
released training scripts use 1 (`--scale_rewards False`). alpha is the paper's accurate gradient estimation:
a group whose completions all got the same reward has zero advantage and no gradient, yet its tokens still count
in the loss's mean, which shrinks the gradient of the groups that do teach something. With B groups of which M
have no reward spread, alpha = B / (B - M) undoes that shrinking.

Departures from the authors' code, both consequences of where a plugin sits: alpha scales the advantage, so it
scales the policy-gradient term but not a KL term (algorithm.beta > 0; GPG itself uses none); and it counts the
groups of this process's generation batch, where the authors count all processes' groups. The authors also keep
sampling until at least a share beta_th of the groups has spread; `+hook=dynamic_sampling` does the stricter
thing of filling the whole batch with such groups (alpha is then 1).
"""

import torch

from grpo_kit.contract.advantages import nanstd, weighted_rewards
from grpo_kit_example.configs import GPGAdvantageConfig


class GPGAdvantage:
    def __init__(self, config: GPGAdvantageConfig):
        self.gradient_correction = config.gradient_correction
        self.normalize_by_std = config.normalize_by_std

    def __call__(self, rewards_per_func, weights, num_generations):
        groups = weighted_rewards(rewards_per_func, weights).view(-1, num_generations)  # (B, G), NaN: unscored
        std = nanstd(groups, dim=1, keepdim=True)  # NaN for a group with fewer than two scored completions
        advantages = groups - groups.nanmean(dim=1, keepdim=True)
        if self.normalize_by_std:
            advantages = advantages / (std + 1e-4)  # a group with equal rewards stays at 0
        if self.gradient_correction:
            advantages = advantages * alpha(std.squeeze(1))
        return advantages.view(-1)


def alpha(group_std: torch.Tensor) -> torch.Tensor:
    """B / (B - M): all groups over the groups whose rewards differ; 1 when none differ (then nothing trains)."""
    with_spread = (group_std > 0).sum()  # NaN > 0 is False: an unscorable group has no spread
    if with_spread == 0:
        return torch.ones(())
    return group_std.numel() / with_spread
