"""grpo: the clipped surrogate averaged over each sequence's tokens, then over sequences.

DeepSeekMath (Shao et al. 2024), https://arxiv.org/abs/2402.03300, eq. 3: the 1/|o_i| inside the sum is the
per-sequence mean. It prefers short correct answers and long wrong ones (Dr. GRPO, https://arxiv.org/abs/2503.20783).
With importance_sampling=sequence it is GSPO (https://arxiv.org/abs/2507.18071).
"""

from grpo_kit.contract.reductions import sequence_mean
from grpo_kit_losses.clipped import ClippedSurrogate


class GRPO(ClippedSurrogate):
    liger_loss_type = "grpo"

    def reduce(self, per_token_loss, mask, reduction):
        return sequence_mean(per_token_loss, mask, reduction)
