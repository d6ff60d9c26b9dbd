"""dapo: the clipped surrogate summed over tokens and divided by the active tokens of the whole batch.

DAPO (Yu et al. 2025), https://arxiv.org/abs/2503.14476, eq. 10 ("token-level policy gradient loss"): every
token weighs the same whatever the length of its sequence. The normaliser counts the whole generation batch
across processes, so micro-batching does not change the gradient.
"""

from grpo_kit.contract.reductions import global_token_mean
from grpo_kit_losses.clipped import ClippedSurrogate
from grpo_kit_losses.token_sums import SUMS_TOKENS_ADVICE


class DAPO(ClippedSurrogate):
    liger_loss_type = "dapo"
    liger_per_micro_batch = False
    importance_sampling_advice = SUMS_TOKENS_ADVICE

    def reduce(self, per_token_loss, mask, reduction):
        return global_token_mean(per_token_loss, mask, reduction)
