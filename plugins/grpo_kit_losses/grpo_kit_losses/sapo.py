"""sapo: a smooth gate in place of the hard clip, with a sharper temperature for negative advantages.

SAPO, Soft Adaptive Policy Optimization (https://arxiv.org/abs/2511.20347): the weight is
f(r) = sigmoid(tau * (r - 1)) * 4 / tau, equal to r's slope at r = 1 and fading away from it; tau is
`temperature_pos` where the advantage is positive, `temperature_neg` elsewhere. Reduced per sequence like grpo.
"""

import torch

from grpo_kit.contract.kinds import LigerLoss, Loss
from grpo_kit.contract.reductions import sequence_mean
from grpo_kit_losses.configs import SAPOConfig


class SAPO(Loss):
    def __init__(self, config: SAPOConfig):
        self.temperature_pos, self.temperature_neg = config.temperature_pos, config.temperature_neg

    def per_token_loss(self, inputs):
        ratio = torch.exp(inputs.log_weights)
        temperature = torch.where(inputs.advantages > 0, self.temperature_pos, self.temperature_neg)  # (B, 1)
        gate = torch.sigmoid(temperature * (ratio - 1)) * 4 / temperature
        return -gate * inputs.advantages, {}

    def reduce(self, per_token_loss, mask, reduction):
        return sequence_mean(per_token_loss, mask, reduction)

    def liger_loss(self):
        temperatures = {"sapo_temperature_pos": self.temperature_pos, "sapo_temperature_neg": self.temperature_neg}
        return LigerLoss("sapo", temperatures)
