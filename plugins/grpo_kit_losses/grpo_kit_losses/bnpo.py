"""bnpo: the clipped surrogate averaged over the active tokens of the micro-batch.

Batch-normalised policy optimisation: the token-level mean of DAPO (https://arxiv.org/abs/2503.14476, eq. 10)
taken over the local micro-batch only, so its normaliser changes with how the batch is split.
"""

from grpo_kit.contract.reductions import local_token_mean
from grpo_kit_losses.clipped import ClippedSurrogate
from grpo_kit_losses.token_sums import SUMS_TOKENS_ADVICE


class BNPO(ClippedSurrogate):
    liger_loss_type = "bnpo"
    importance_sampling_advice = SUMS_TOKENS_ADVICE

    def reduce(self, per_token_loss, mask, reduction):
        return local_token_mean(per_token_loss, mask, reduction)
