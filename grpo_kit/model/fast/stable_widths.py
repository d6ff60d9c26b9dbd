"""Training passes of few distinct widths: each pass's sequence width rounded up to a multiple (TRL's
pad_to_multiple_of).

What it speeds up: every forward and backward pass over a micro-batch on a GPU (training, old and reference log-probs,
every logits path). Each micro-batch is cut to its own longest completion, so nearly every pass has a width of its
own, and on a GPU every new shape costs new kernel plans (cuDNN's attention plans one per shape, at tens of
milliseconds of host time) and new blocks from the caching allocator. With the width (prompt columns and completion
columns) rounded up to a multiple of 64, a run sees a handful of widths. The extra columns are padding after every
completion, masked, which causal attention never lets an earlier position see: every value is the unpadded pass's,
up to float rounding.

When it applies: model.pad_to_multiple_of=auto (the default) rounds to 64 on a CUDA GPU and not elsewhere (on a CPU
the padding costs time and saves no plan); a number rounds to it everywhere; null never rounds.

Switch: model.pad_to_multiple_of.
"""

import torch

from grpo_kit.contract.errors import ConfigError
from grpo_kit.contract.micro_batch import MicroBatch

ON_CUDA = 64  # model.pad_to_multiple_of=auto on a CUDA GPU


def check_multiple(setting) -> None:
    """Refuse a model.pad_to_multiple_of that is neither auto, null nor a positive number of tokens."""
    if setting is None or setting == "auto":
        return
    if isinstance(setting, bool) or not isinstance(setting, int) or setting < 1:
        raise ConfigError(
            f"model.pad_to_multiple_of={setting!r} must be auto (64 on a CUDA GPU, none elsewhere), null (no "
            "rounding) or a positive number of tokens."
        )


def width_multiple(setting, device: torch.device) -> int | None:
    """The multiple a pass's width is rounded up to on `device`, or None."""
    if setting == "auto":
        return ON_CUDA if device.type == "cuda" else None
    return setting


def at_a_multiple_width(forward, batch: MicroBatch, multiple: int | None):
    """`forward(batch)`, whose tensors are (B, T, ...) over the completion positions, run on `batch` with its
    completions padded on the right so that the pass's width (prompt + completion columns) is a multiple of
    `multiple`; its outputs cut back to the T positions."""
    length = batch.completion_ids.shape[1]
    width = batch.prompt_ids.shape[1] + length
    extra = 0 if multiple is None else -width % multiple
    if extra == 0:
        return forward(batch)
    out = forward(batch.padded(extra))  # (B, T + extra): masked columns, after every token
    if isinstance(out, tuple):
        return tuple(part[:, :length] for part in out)
    return out[:, :length]
