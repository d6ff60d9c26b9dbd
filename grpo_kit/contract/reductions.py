"""Ways to reduce a per-token loss to the micro-batch's scalar, for loss plugins to choose from.

Each divides by the gradient-accumulation steps in its own way, so that the accumulated gradient of an
optimizer step is the gradient of the loss over the whole step's batch. A per-token loss may be (B, T), or
(B, 1) when the importance weights are per sequence; it then broadcasts against the (B, T) mask.
"""

import torch

from grpo_kit.contract.kinds import Reduction


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over the active tokens; a (B, 1) sequence-level tensor is a plain mean over sequences."""
    if values.shape[1] == 1:
        return values.mean()
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def per_sequence_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:  # (B,)
    """Each sequence's mean over its active tokens (NaN for a sequence with none)."""
    if values.shape[1] == 1:
        return values.squeeze(1)
    return (values * mask).sum(-1) / mask.sum(-1)


def sequence_mean(per_token_loss: torch.Tensor, mask: torch.Tensor, reduction: Reduction) -> torch.Tensor:
    """Each sequence's mean over its own tokens, then the mean over sequences (the original GRPO)."""
    per_sequence = (per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)  # (B,)
    return reduction.mean_over_completions(per_sequence)


def local_token_mean(per_token_loss: torch.Tensor, mask: torch.Tensor, reduction: Reduction) -> torch.Tensor:
    """Mean over the active tokens of this micro-batch only."""
    return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0) / reduction.gradient_accumulation_steps


def constant_length_mean(per_token_loss: torch.Tensor, mask: torch.Tensor, reduction: Reduction) -> torch.Tensor:
    """Sum over active tokens divided by B x max_completion_length, a constant that carries no length bias."""
    if reduction.rows_per_micro_batch is not None:
        return reduction.mean_over_completions((per_token_loss * mask).sum(-1)) / reduction.max_completion_length
    total = (per_token_loss * mask).sum() / (per_token_loss.size(0) * reduction.max_completion_length)
    return total / reduction.gradient_accumulation_steps


def global_token_mean(per_token_loss: torch.Tensor, mask: torch.Tensor, reduction: Reduction) -> torch.Tensor:
    """Sum over active tokens divided by the active tokens of one optimizer step's share of the generation batch
    (`Reduction.tokens_per_step`), so that every token weighs the same however the batch is split."""
    return (per_token_loss * mask).sum() / reduction.tokens_per_step


def length_weighted_sequence_mean(
    per_token_loss: torch.Tensor, mask: torch.Tensor, reduction: Reduction
) -> torch.Tensor:
    """Each sequence's loss summed over its tokens (so weighted by its length), then the mean over sequences."""
    return reduction.mean_over_completions((per_token_loss * mask).sum(-1))
