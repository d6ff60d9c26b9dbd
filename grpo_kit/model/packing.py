"""Padding-free passes (trainer.packing): several sequences in one row, each attending only to itself.

Each completion's real tokens (its prompt's and its own, without padding) are laid one after another into rows as
long as the micro-batch's longest sequence (first-fit, longest first), with position ids that restart at 0 for each
sequence. Given position ids with restarts and no attention mask, transformers keeps each sequence's attention
within itself: SDPA and eager get a packed-sequence mask (masking_utils.find_packed_sequence_indices), and
flash-attention runs its variable-length kernel. The hidden states that predict the completion tokens are then
gathered back into the (B, T, H) layout every logits path reads (full, chunked, Liger), so the training pass, the
old and the reference log-probs all pack alike.

Values: the padded pass's up to float rounding where the model's positions are relative (rotary embeddings: Qwen2,
Llama and most current models): a sequence's positions from 0 instead of its column in the padded layout shift every
position by the same number. A model whose attention ignores packed position ids, or whose positions are absolute
(GPT-2), would give other values: the first packed pass over each model is compared with the padded pass, and a
model that fails the comparison is refused (`PackingRefused`).

Where a micro-batch cannot be packed (a row with padding inside its tokens, which a custom rollout's mask may have,
or a row with no prompt token to predict its first completion token), its passes run padded, and the log says so
once. The padded path's own padding savers (model.mask_free_passes, model.passes_by_length) do not apply to packed
passes, which have no padding to save; model.cpu_chunked_attention leaves a pass with several sequences per row to
SDPA, which then reads the packed-sequence mask.
"""

import logging
from dataclasses import dataclass, replace

import torch

from grpo_kit.contract.errors import ConfigError
from grpo_kit.contract.micro_batch import MicroBatch
from grpo_kit.model.fast.switches import speed_ups_of, use_speed_ups

log = logging.getLogger(__name__)

CHECKED = "_grpo_kit_packing_checked"  # set on a model whose packed pass was found to equal its padded pass
_logged: set[str] = set()


class PackingRefused(ConfigError):
    """The model's packed pass is not its padded pass: trainer.packing cannot be used with it."""


@dataclass
class PackedRows:
    """A micro-batch's sequences packed into rows, and where each completion token's predictor landed."""

    inputs: dict[str, torch.Tensor]  # input_ids and position_ids, (R, C) each
    real: torch.Tensor  # (R, C) 1 on the sequences' tokens, 0 on the padding at the rows' ends
    predictors: torch.Tensor  # (B, T) the flat position in (R * C) whose output predicts completion token t of row b
    predicted: torch.Tensor  # (B, T) bool: the completion tokens that have a predictor (the others are padding)


def pack(batch: MicroBatch, capacity: int | None = None) -> PackedRows | None:
    """`batch`'s sequences packed into rows of `capacity` tokens (None: its longest sequence's); None where a row's
    tokens are not one span that starts in its prompt."""
    prompt_width = batch.prompt_ids.shape[1]
    input_ids = torch.cat([batch.prompt_ids, batch.completion_ids], dim=1)  # (B, W)
    attention = torch.cat([batch.prompt_mask, batch.completion_mask], dim=1)  # (B, W)
    device = input_ids.device
    columns = torch.arange(input_ids.shape[1], device=device)
    starts, lengths = attention.argmax(dim=1), attention.sum(dim=1)  # (B,) each
    span = (columns >= starts[:, None]) & (columns < (starts + lengths)[:, None])
    if not torch.equal(span, attention.bool()) or bool((starts >= prompt_width).any()):
        _say_once(
            "trainer.packing: a micro-batch has a row whose tokens are not one span starting in its prompt (padding "
            "inside it, or no prompt): its passes run padded."
        )
        return None
    starts_list, lengths_list = starts.tolist(), lengths.tolist()
    capacity = capacity or max(lengths_list)
    rows = first_fit(lengths_list, capacity)
    ids = input_ids.new_zeros(len(rows), capacity)
    positions = torch.empty(len(rows), capacity, dtype=torch.long, device=device)
    real = torch.zeros(len(rows), capacity, dtype=torch.long, device=device)
    first_token = torch.empty(len(lengths_list), dtype=torch.long, device=device)  # (B,) flat, of each sequence
    for row, sequences in enumerate(rows):
        offset = 0
        for sequence in sequences:
            start, length = starts_list[sequence], lengths_list[sequence]
            ids[row, offset : offset + length] = input_ids[sequence, start : start + length]
            positions[row, offset : offset + length] = torch.arange(length, device=device)
            first_token[sequence] = row * capacity + offset
            offset += length
        real[row, :offset] = 1
        # The padding continues the row's last sequence: causal attention keeps it out of every real token, and a
        # row with one sequence keeps plain positions, which needs no mask at all.
        positions[row, offset:] = torch.arange(length, length + capacity - offset, device=device)
    completion_length = batch.completion_ids.shape[1]
    # Completion token t sits in column prompt_width + t of the padded layout, and the token before it predicts it.
    within = prompt_width - 1 - starts[:, None] + torch.arange(completion_length, device=device)  # (B, T)
    predicted = batch.completion_mask.bool()
    predictors = torch.where(predicted, first_token[:, None] + within, 0)
    return PackedRows({"input_ids": ids, "position_ids": positions}, real, predictors, predicted)


def first_fit(lengths: list[int], capacity: int) -> list[list[int]]:
    """The sequences (indices into `lengths`) of each row: longest first, each into the first row it fits."""
    rows: list[list[int]] = []
    free: list[int] = []
    for sequence in sorted(range(len(lengths)), key=lambda index: -lengths[index]):
        row = next((row for row, room in enumerate(free) if room >= lengths[sequence]), None)
        if row is None:
            rows.append([])
            free.append(capacity)
            row = len(rows) - 1
        rows[row].append(sequence)
        free[row] -= lengths[sequence]
    return rows


def unpacked(values: torch.Tensor, packed: PackedRows) -> torch.Tensor:  # (R, C, H) -> (B, T, H)
    """The packed pass's outputs at the positions that predict each completion token, in the (B, T) layout; zeros
    where a completion is padding."""
    flat = values.reshape(-1, values.shape[-1])
    gathered = flat[packed.predictors]  # (B, T, H)
    return torch.where(packed.predicted.unsqueeze(-1), gathered, torch.zeros((), dtype=values.dtype))


def check_packing(model, batch: MicroBatch, run_padded, run_packed) -> None:
    """Once per model: two of `batch`'s sequences in one packed row give the hidden states the padded pass gives
    them, else `PackingRefused`. `run_padded(batch)` and `run_packed(packed)` return (B, T, H) hidden states."""
    if getattr(model, CHECKED, False):
        return
    rows = torch.arange(min(len(batch.completion_ids), 2)).repeat(2)[:2]  # two sequences, or one twice
    probe = batch.rows(rows)
    lengths = torch.cat([probe.prompt_mask, probe.completion_mask], dim=1).sum(dim=1)
    packed = pack(probe, capacity=int(lengths.sum()))  # both in one row
    if packed is None:
        return  # the passes of such a batch run padded: the next one is checked
    with torch.no_grad():
        expected, actual = run_padded(probe).float(), run_packed(packed).float()
    mask = packed.predicted.unsqueeze(-1)
    difference = ((expected - actual).abs() * mask).max().item()
    scale = (expected.abs() * mask).max().item()
    low_precision = actual.dtype != torch.float32 or torch.is_autocast_enabled(expected.device.type)
    if not difference <= (5e-2 if low_precision else 1e-3) * scale + 1e-5:
        name = type(model).__name__
        raise PackingRefused(
            f"trainer.packing=true: {name} ({model.config._attn_implementation} attention) gives packed sequences "
            f"other values than padded ones (hidden states differ by up to {difference:.3g}, at a scale of "
            f"{scale:.3g}): its attention does not keep packed sequences apart, or its positions are absolute. Set "
            "trainer.packing=false for this model."
        )
    setattr(model, CHECKED, True)


def _say_once(message: str) -> None:
    if message not in _logged:
        _logged.add(message)
        log.warning(message)


def use_packing(model) -> None:
    """Every pass over `model`, and over the copies made of it afterwards (the reference), packed."""
    use_speed_ups(model, replace(speed_ups_of(model), packing=True))
