"""cispo: REINFORCE with the importance weight clipped from above and detached, so no token loses its gradient.

CISPO, MiniMax-M1 (https://arxiv.org/abs/2506.13585, eq. 4): the loss is -sg(min(r, eps_max)) * A * log pi_theta,
reduced over the active tokens of the batch like dapo. eps_max (`epsilon_high`) defaults to 5.0, the value
ScaleRL recommends (https://arxiv.org/abs/2510.13786); TRL falls back to `epsilon` instead.
"""

import torch

from grpo_kit.contract.kinds import LigerLoss, Loss
from grpo_kit.contract.reductions import global_token_mean, masked_mean
from grpo_kit_losses.configs import CISPOConfig
from grpo_kit_losses.token_sums import SUMS_TOKENS_ADVICE


class CISPO(Loss):
    importance_sampling_advice = SUMS_TOKENS_ADVICE

    def __init__(self, config: CISPOConfig):
        self.epsilon_high = config.epsilon_high

    def per_token_loss(self, inputs):
        ratio = torch.exp(inputs.log_weights)
        clipped = torch.clamp(ratio, max=self.epsilon_high).detach()
        per_token_loss = -clipped * inputs.advantages * inputs.per_token_logps  # (B, T)
        is_clipped = ((ratio > self.epsilon_high) & (inputs.advantages > 0)).float()
        return per_token_loss, {"cispo_clip_ratio": masked_mean(is_clipped, inputs.mask)}

    def reduce(self, per_token_loss, mask, reduction):
        return global_token_mean(per_token_loss, mask, reduction)

    def liger_loss(self):
        return LigerLoss("cispo", {"epsilon_high": self.epsilon_high}, per_micro_batch=False)
