"""A micro-batch of mixed completion lengths as two forward passes, each as long as its own longest completion.

What it speeds up: every forward pass over a micro-batch (training, old and reference log-probs, both the full and
the chunked logits paths). Rows are sorted by completion length and split into the shorter and the longer half;
each half runs on its own rows and as many completion positions as its longest completion. Each row's values are
what one pass over the whole micro-batch gives, up to float rounding: causal attention never lets a position see the
padding after it, and prompts keep their columns, so their positions.

When it applies: where the two passes cover at least MIN_SAVING fewer positions than one; otherwise one pass runs.

On a CUDA GPU it is off unless asked for (model.passes_by_length=auto): each group is one more pass and one more shape,
whose kernel plans cost more there than the padding they save.

Switch: model.passes_by_length=false always runs one pass, true splits wherever it saves. Figures: benchmarks/README.md,
"Length groups".
"""

import torch
from torch import nn

from grpo_kit.contract.errors import ConfigError
from grpo_kit.contract.micro_batch import MicroBatch

MIN_SAVING = 0.2  # two forward passes instead of one where they cover at least this share fewer positions


def check_length_groups(setting) -> None:
    """Refuse a model.passes_by_length that is neither true, false nor auto."""
    if setting not in (True, False, "auto"):
        raise ConfigError(f"model.passes_by_length={setting!r} must be true, false or auto (on, but on a CUDA GPU).")


def length_groups(completion_mask: torch.Tensor, prompt_length: int) -> list[torch.Tensor]:
    """The rows of a micro-batch as one group, or as two by completion length (the shorter half, the longer half)
    where two forward passes, each as long as its own longest completion, cover MIN_SAVING fewer positions."""
    lengths = completion_mask.sum(dim=1).clamp(min=1)  # (B,)
    rows = torch.arange(len(lengths), device=lengths.device)
    if len(lengths) < 2:
        return [rows]
    short, long = lengths.argsort(stable=True).chunk(2)
    whole = len(lengths) * (prompt_length + int(lengths.max()))
    split = sum(len(half) * (prompt_length + int(lengths[half].max())) for half in (short, long))
    return [short, long] if split <= (1 - MIN_SAVING) * whole else [rows]


def in_length_groups(forward, batch: MicroBatch):
    """`forward(batch)`, whose tensors are (B, T, ...) over the completion positions, computed for each length group
    on its own rows and as many completion positions as its longest completion; zeros where a group stops short."""
    groups = length_groups(batch.completion_mask, batch.prompt_ids.shape[1])
    if len(groups) == 1:
        return forward(batch)
    length = batch.width
    outputs = []
    for rows in groups:
        group = batch.rows(rows)
        outputs.append(forward(group.cut(max(int(group.completion_mask.sum(dim=1).max()), 1))))
    order = torch.cat(groups)
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(len(order), device=order.device)

    def assembled(parts):  # (B_g, width_g, ...) each -> (B, T, ...) in the micro-batch's row order
        padded = [nn.functional.pad(part, [0, 0] * (part.dim() - 2) + [0, length - part.shape[1]]) for part in parts]
        return torch.cat(padded)[inverse]

    if isinstance(outputs[0], tuple):
        return tuple(assembled(parts) for parts in zip(*outputs))
    return assembled(outputs)
