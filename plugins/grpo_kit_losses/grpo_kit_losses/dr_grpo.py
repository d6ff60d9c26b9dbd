"""dr_grpo: the clipped surrogate summed over tokens and divided by a constant, B x max_completion_length.

Dr. GRPO, "Understanding R1-Zero-Like Training" (Liu et al. 2025), https://arxiv.org/abs/2503.20783, eq. 3:
dropping GRPO's 1/|o_i| removes its length bias. Pair it with advantage=none (no std scaling) as the paper does.
"""

from grpo_kit.contract.reductions import constant_length_mean
from grpo_kit_losses.clipped import ClippedSurrogate
from grpo_kit_losses.token_sums import SUMS_TOKENS_ADVICE


class DrGRPO(ClippedSurrogate):
    liger_loss_type = "dr_grpo"
    importance_sampling_advice = SUMS_TOKENS_ADVICE

    def reduce(self, per_token_loss, mask, reduction):
        return constant_length_mean(per_token_loss, mask, reduction)
