"""Which speed-ups a model's training passes take, set from the config when the model is loaded.

`load_model` attaches them to the model it returns, so every pass over it (the training pass, the old and the
reference log-probs, a LoRA policy's adapter-free reference, a deep copy) takes the same ones, whoever calls it.
A model loaded otherwise takes every speed-up where it applies.
"""

from dataclasses import dataclass
from typing import Any

ATTRIBUTE = "_grpo_kit_speed_ups"


@dataclass(frozen=True)
class SpeedUps:
    """Each true: the speed-up where it applies (fast/*.py says where); false: the plain path. The config's
    model.mask_free_passes, model.passes_by_length (auto: off on a CUDA GPU, where each group is one more shape),
    model.cpu_chunked_attention and model.pad_to_multiple_of (fast/stable_widths.py); and trainer.packing, off unless
    asked for (grpo_kit/model/packing.py), and trainer.torch_compile, likewise (fast/compiled.py)."""

    mask_free_passes: bool = True
    passes_by_length: Any = "auto"  # true, false, or auto
    cpu_chunked_attention: bool = True
    packing: bool = False
    pad_to_multiple_of: Any = "auto"  # tokens, None, or auto
    torch_compile: Any = None  # trainer.torch_compile: (backend, mode) of the passes' torch.compile; None: off


def takes_length_groups(speed_ups: SpeedUps, device) -> bool:
    """Whether passes on `device` run in length groups: model.passes_by_length, where auto is on but on a CUDA GPU."""
    return device.type != "cuda" if speed_ups.passes_by_length == "auto" else bool(speed_ups.passes_by_length)


def use_speed_ups(model, speed_ups: SpeedUps) -> None:
    setattr(model, ATTRIBUTE, speed_ups)


def speed_ups_of(model) -> SpeedUps:
    """`model`'s speed-ups; `model` is the transformers model itself or its PEFT wrapper, which reads through."""
    return getattr(model, ATTRIBUTE, SpeedUps())
