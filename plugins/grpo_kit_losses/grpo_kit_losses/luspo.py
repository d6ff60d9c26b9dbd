"""luspo: the clipped surrogate on sequence-level weights, each sequence's loss weighted by its length.

LUSPO, length-unbiased sequence policy optimisation (https://arxiv.org/abs/2602.05261): GSPO's per-sequence
mean shrinks the gradient of long answers; summing over each sequence's tokens before the mean over sequences
removes that bias. The paper uses sequence-level importance weights (importance_sampling=sequence).
"""

from grpo_kit.contract.reductions import length_weighted_sequence_mean
from grpo_kit_losses.clipped import ClippedSurrogate


class LUSPO(ClippedSurrogate):
    liger_loss_type = "luspo"
    importance_sampling_advice = "is defined on one importance weight per sequence, as in its paper"

    def reduce(self, per_token_loss, mask, reduction):
        return length_weighted_sequence_mean(per_token_loss, mask, reduction)
