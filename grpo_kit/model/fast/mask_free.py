"""Forward passes without an attention mask: rows moved left so that causal attention alone keeps them from padding.

What it speeds up: every forward pass over a micro-batch (training, old and reference log-probs, both the full and
the chunked logits paths). Prompts are padded on the left and completions on the right, so each row's tokens are one
span between padding. Once each row is moved left to start at column 0 (its padding wrapped to its end), causality
alone keeps its tokens from the padding: the model runs without an attention mask, and SDPA runs its causal kernel
instead of building and reading a (B, 1, W, W) mask. Position ids keep each token's column in the padded layout,
the positions the masked pass gives it, so every value is the masked pass's up to float rounding.

When it applies: wherever every row's tokens are one span; the masked pass stays where a row has padding inside its
span (a custom rollout's mask may), where the moved padding's positions would pass the model's last one, and where
a row would move by more than `max_shift` (a pass that computes logits needs that many more positions of them).

Switch: model.mask_free_passes=false runs every pass with the attention mask. Figures: benchmarks/README.md,
"Mask-free passes".
"""

import torch


def mask_free_inputs(
    input_ids: torch.Tensor,  # (B, W): each row's prompt, then its completion
    attention_mask: torch.Tensor,  # (B, W)
    text_config,
    max_shift: int | None = None,
) -> tuple[dict[str, torch.Tensor], torch.Tensor] | None:
    """The model's inputs with each row moved left to start at column 0, and how far each row moved (B,); None
    where the masked pass must stay."""
    width = input_ids.shape[1]
    columns = torch.arange(width, device=input_ids.device)  # (W,)
    shift = attention_mask.argmax(dim=1)  # (B,) the row's padding before its first token
    span = (columns >= shift[:, None]) & (columns < (shift + attention_mask.sum(dim=1))[:, None])  # (B, W)
    last_position = getattr(text_config, "max_position_embeddings", None)
    longest_shift = int(shift.max())
    if (
        not torch.equal(span, attention_mask.bool())
        or (last_position and width + longest_shift > last_position)
        or (max_shift is not None and longest_shift > max_shift)
    ):
        return None
    if not shift.any():
        return {"input_ids": input_ids}, shift
    moved = (columns + shift[:, None]) % width  # (B, W): the columns each row's tokens come from
    return {"input_ids": input_ids.gather(1, moved), "position_ids": columns + shift[:, None]}, shift


def longest_move_for_logits(width: int, vocab_size: int) -> int:
    """The farthest a row may move in a pass that computes logits: moved rows need as many more positions of
    logits, which should hold no more numbers than the (B, 1, W, W) mask they save."""
    return width * width // vocab_size
