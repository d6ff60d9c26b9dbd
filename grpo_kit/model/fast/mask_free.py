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

Without a read of the GPU: whether the rows are one span and how far they move decide what the pass runs, so the
host must know them, and on a GPU each read of a tensor's value waits for every kernel queued before it. They are
read once per generation batch instead (`with_row_spans`, which GenerationBatches.make calls) and carried in each
micro-batch as its `RowSpans`; a micro-batch made otherwise (a test, a script) has them read at its pass.

Switch: model.mask_free_passes=false runs every pass with the attention mask. Figures: benchmarks/README.md,
"Mask-free passes".
"""

from dataclasses import replace

import torch

from grpo_kit.contract.micro_batch import MicroBatch, RowSpans


def row_spans(batch: MicroBatch) -> RowSpans:
    """`batch`'s RowSpans: those its maker recorded, else read from its masks (one host read)."""
    return batch.row_spans or _read([batch])[0]


def with_row_spans(micro_batches: list[MicroBatch]) -> list[MicroBatch]:
    """The micro-batches with their RowSpans recorded, read with one host read for all of them."""
    return [replace(batch, row_spans=spans) for batch, spans in zip(micro_batches, _read(micro_batches))]


def _read(batches: list[MicroBatch]) -> list[RowSpans]:
    facts = torch.stack([_spans_on_device(batch) for batch in batches]).tolist()  # (N, 2): the one read
    return [RowSpans(bool(one_span), int(longest_shift)) for one_span, longest_shift in facts]


def _spans_on_device(batch: MicroBatch) -> torch.Tensor:  # (2,): one span (0 or 1), longest shift
    attention_mask = torch.cat([batch.prompt_mask, batch.completion_mask], dim=1)  # (B, W)
    columns = torch.arange(attention_mask.shape[1], device=attention_mask.device)  # (W,)
    shift = attention_mask.argmax(dim=1)  # (B,) the row's padding before its first token
    span = (columns >= shift[:, None]) & (columns < (shift + attention_mask.sum(dim=1))[:, None])  # (B, W)
    return torch.stack([(span == attention_mask.bool()).all().long(), shift.max()])


def mask_free_inputs(
    input_ids: torch.Tensor,  # (B, W): each row's prompt, then its completion
    attention_mask: torch.Tensor,  # (B, W)
    text_config,
    spans: RowSpans,
    max_shift: int | None = None,
) -> tuple[dict[str, torch.Tensor], torch.Tensor] | None:
    """The model's inputs with each row moved left to start at column 0, and how far each row moved (B,); None
    where the masked pass must stay. Decided from `spans` and the shapes alone: no value is read back."""
    width = input_ids.shape[1]
    last_position = getattr(text_config, "max_position_embeddings", None)
    longest_shift = spans.longest_shift
    if (
        not spans.one_span
        or (last_position and width + longest_shift > last_position)
        or (max_shift is not None and longest_shift > max_shift)
    ):
        return None
    if longest_shift == 0:  # every row starts at column 0 already
        return {"input_ids": input_ids}, torch.zeros(len(input_ids), dtype=torch.long, device=input_ids.device)
    columns = torch.arange(width, device=input_ids.device)  # (W,)
    shift = attention_mask.argmax(dim=1)  # (B,)
    moved = (columns + shift[:, None]) % width  # (B, W): the columns each row's tokens come from
    return {"input_ids": input_ids.gather(1, moved), "position_ids": columns + shift[:, None]}, shift


def longest_move_for_logits(width: int, vocab_size: int) -> int:
    """The farthest a row may move in a pass that computes logits: moved rows need as many more positions of
    logits, which should hold no more numbers than the (B, 1, W, W) mask they save."""
    return width * width // vocab_size
