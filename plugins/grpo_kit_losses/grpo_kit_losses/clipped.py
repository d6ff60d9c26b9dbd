"""The clipped surrogate shared by grpo, bnpo, dr_grpo, dapo and luspo, which differ only in how they reduce it.

PPO's clipped objective (Schulman et al. 2017, https://arxiv.org/abs/1707.06347) as GRPO uses it
(DeepSeekMath, https://arxiv.org/abs/2402.03300, eq. 3), with DAPO's decoupled upper bound `epsilon_high`
(https://arxiv.org/abs/2503.14476, eq. 10) and INTELLECT-2's two-sided bound `delta` on the unclipped ratio
(https://arxiv.org/abs/2505.07291).
"""

import torch

from grpo_kit.contract.kinds import LigerLoss, Loss
from grpo_kit.contract.reductions import masked_mean, per_sequence_mean
from grpo_kit_losses.configs import ClippedConfig


class ClippedSurrogate(Loss):
    # liger-kernel's loss_type for this reduction of the surrogate (model.logits=liger); None: Liger has none.
    liger_loss_type: str | None = None
    liger_per_micro_batch = True  # False: Liger normalises by the generation batch's tokens, as `reduce` does

    def __init__(self, config: ClippedConfig):
        self.epsilon_low = config.epsilon
        self.epsilon_high = config.epsilon if config.epsilon_high is None else config.epsilon_high
        self.delta = config.delta

    def per_token_loss(self, inputs):
        ratio = torch.exp(inputs.log_weights)  # (B, T) or (B, 1)
        clipped_ratio = torch.clamp(ratio, 1 - self.epsilon_low, 1 + self.epsilon_high)
        if self.delta is not None:
            ratio = torch.clamp(ratio, max=self.delta)
        advantages = inputs.advantages  # (B, 1)
        per_token_loss = -torch.min(ratio * advantages, clipped_ratio * advantages)

        low = ((ratio < 1 - self.epsilon_low) & (advantages < 0)).float()
        high = ((ratio > 1 + self.epsilon_high) & (advantages > 0)).float()
        mask = inputs.mask
        metrics = {
            "clip_ratio/low_mean": masked_mean(low, mask),
            "clip_ratio/high_mean": masked_mean(high, mask),
            "clip_ratio/region_mean": masked_mean(torch.max(low, high), mask),
            "clip_ratio/low_min": _nan_reduce(per_sequence_mean(low, mask), torch.min),
            "clip_ratio/high_max": _nan_reduce(per_sequence_mean(high, mask), torch.max),
        }
        return per_token_loss, metrics

    def liger_loss(self) -> LigerLoss | None:
        if self.liger_loss_type is None:
            return None
        options = {"epsilon_low": self.epsilon_low, "epsilon_high": self.epsilon_high, "delta": self.delta}
        return LigerLoss(self.liger_loss_type, options, per_micro_batch=self.liger_per_micro_batch)


def _nan_reduce(values: torch.Tensor, reduce) -> torch.Tensor:
    """min or max over the sequences that have tokens (NaN when none has). The others are set to what the reduction
    ignores rather than indexed out: a boolean index sizes its result by the values, which waits for a GPU."""
    missing = values.isnan()
    ignored = float("inf") if reduce is torch.min else float("-inf")
    return torch.where(missing.all(), float("nan"), reduce(values.masked_fill(missing, ignored)))
