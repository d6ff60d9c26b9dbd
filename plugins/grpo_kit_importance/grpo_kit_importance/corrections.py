"""Rollout corrections: reweight for the gap between the sampler's and the trainer's probabilities.

A fast sampler (vLLM, or any backend that reports its own log-probs) does not sample exactly from the policy
being trained. The ratio pi_old / pi_sampler corrects the policy gradient for that mismatch ("Your Efficient
RL Framework Secretly Brings You Off-Policy RL Training", Yao et al. 2025, https://fengyao.notion.site/off-policy-rl;
truncated importance sampling as in IMPALA, https://arxiv.org/abs/1802.01561). The ratio is formed per token or,
as the product over the sequence, per sequence; then either truncated into [min, max] or, in the masked
variants, set to 0 wherever it falls outside [min, max].
"""

import math

import torch

from grpo_kit_importance.configs import CorrectionConfig


class RolloutCorrection:
    level: str  # "token" or "sequence": declared where each correction is registered (plugin.py)
    masks: bool  # True: out-of-bounds ratios become 0; False: they are clamped to the bound

    def __init__(self, config: CorrectionConfig):
        if config.min is not None and config.max is not None and config.min >= config.max:
            raise ValueError(f"rollout_correction.min={config.min} must be below rollout_correction.max={config.max}.")
        if not self.masks and config.min is None and config.max is None:
            raise ValueError(
                "A truncating rollout correction needs a bound: set rollout_correction.max (3.0 is usual) "
                "or rollout_correction.min."
            )
        self.min, self.max = config.min, config.max

    def ratio(self, old_per_token_logps, sampling_per_token_logps, mask):
        # A token the sampler could not score (NaN) gets a log-ratio of 0: no evidence, no correction.
        log_ratio = torch.nan_to_num((old_per_token_logps - sampling_per_token_logps) * mask, nan=0.0)  # (N, T)
        if self.level == "sequence":
            log_ratio = log_ratio.sum(dim=-1, keepdim=True)  # (N, 1)
        ratio = torch.exp(log_ratio)
        if not self.masks:
            return torch.clamp(ratio, min=self.min, max=self.max)
        low = -math.inf if self.min is None else self.min
        high = math.inf if self.max is None else self.max
        return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)


class TokenTruncate(RolloutCorrection):
    """token_truncate: each token's ratio pi_old / pi_sampler, clamped into [min, max]."""

    masks = False


class TokenMask(RolloutCorrection):
    """token_mask: each token's ratio pi_old / pi_sampler, set to 0 where it falls outside [min, max]."""

    masks = True


class SequenceTruncate(RolloutCorrection):
    """sequence_truncate: one ratio per sequence, the product of its tokens' ratios, clamped into [min, max]."""

    masks = False


class SequenceMask(RolloutCorrection):
    """sequence_mask: one ratio per sequence, the product of its tokens' ratios, set to 0 outside [min, max]."""

    masks = True
