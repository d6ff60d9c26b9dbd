"""vespo: REINFORCE scaled by a gamma-shaped function of the sequence's importance weight.

VESPO (https://arxiv.org/abs/2602.10693): phi(w) = exp(lambda) * w^k * exp(-lambda * w), so phi(1) = 1 and
stale sequences (w far from 1) fade out smoothly; (k, lambda) differ for positive and negative advantages.
w is the product of the token ratios, times a token-level rollout-correction ratio when there is one, so the
correction lives inside phi instead of multiplying the loss. phi is a constant scale: -phi * A * log pi_theta.
"""

import math

import torch

from grpo_kit.contract.kinds import LigerLoss, Loss
from grpo_kit.contract.reductions import global_token_mean
from grpo_kit_losses.configs import VESPOConfig

LOG_MIN_WEIGHT = math.log(1e-8)  # the paper's floor on w, applied in log space
LOG_MAX_WEIGHT = 20.0


class VESPO(Loss):
    importance_sampling_advice = "forms its own sequence-level weight from the token log-ratios"
    consumes_rollout_ratio = True

    def __init__(self, config: VESPOConfig):
        self.config = config

    def per_token_loss(self, inputs):
        phi = self.gamma_weight(inputs)  # (B, 1)
        return -phi * inputs.advantages * inputs.per_token_logps, {"vespo/phi_seq_mean": phi.mean()}

    @torch.no_grad()
    def gamma_weight(self, inputs) -> torch.Tensor:  # (B, 1)
        log_ratio = torch.clamp(inputs.log_ratio, -LOG_MAX_WEIGHT, LOG_MAX_WEIGHT)
        log_w = (log_ratio * inputs.mask).sum(-1, keepdim=True)  # log of the product over the sequence
        if inputs.rollout_ratio is not None:
            log_correction = torch.clamp(torch.log(inputs.rollout_ratio), LOG_MIN_WEIGHT, LOG_MAX_WEIGHT)
            # Padding tokens carry no correction (TRL 1.16 sums over them too, which matters only when the
            # bounds exclude a ratio of 1).
            log_w = log_w + (log_correction * inputs.mask).sum(-1, keepdim=True)
        log_w = torch.clamp(log_w, LOG_MIN_WEIGHT, LOG_MAX_WEIGHT)
        c = self.config
        positive = inputs.advantages >= 0
        k = torch.where(positive, c.k_pos, c.k_neg)
        lam = torch.where(positive, c.lambda_pos, c.lambda_neg).clamp(min=1e-4)
        log_phi = lam + k * log_w - lam * torch.exp(log_w)
        return torch.exp(log_phi).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)

    def reduce(self, per_token_loss, mask, reduction):
        return global_token_mean(per_token_loss, mask, reduction)

    def liger_loss(self):
        c = self.config
        options = {
            "vespo_k_pos": c.k_pos,
            "vespo_lambda_pos": c.lambda_pos,
            "vespo_k_neg": c.k_neg,
            "vespo_lambda_neg": c.lambda_neg,
        }
        return LigerLoss("vespo", options, per_micro_batch=False)  # Liger's vespo folds in the correction, as here
