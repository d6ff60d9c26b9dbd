"""A vision-language policy's image inputs, kept one row per completion so that a batch splits like any other.

Qwen2-VL's processor gives a batch's images as one tensor of patches for all of them, `pixel_values` (patches, C),
and each image's grid of patches, `image_grid_thw` (images, 3): neither has a row per prompt. The training batch
holds them padded per row instead, `pixel_values` (N, P, C) and `image_grid_thw` (N, I, 3), zero past each row's
own patches and images, so that micro-batches, length groups and shuffles take a row's images with its tokens.
`model_kwargs` turns any set of rows back into what the model's forward pass takes.
"""

import torch

from grpo_kit.contract.kinds import image_token_types
from grpo_kit.contract.micro_batch import MicroBatch

VISION_COLUMNS = ("pixel_values", "image_grid_thw")  # the training batch's image tensors, one row per completion


def is_vision_language(config) -> bool:
    """Whether a model of this config reads images (its config has a vision tower's)."""
    return getattr(config, "vision_config", None) is not None


def check_supported(model_inputs: dict[str, torch.Tensor], model_name: str) -> None:
    """The processor's outputs must be those of the Qwen2-VL family, the image inputs this module lays out."""
    unknown = sorted(set(model_inputs) - set(VISION_COLUMNS))
    if set(VISION_COLUMNS) - set(model_inputs) or unknown:
        raise ValueError(
            f"The processor of {model_name} gives the image inputs {sorted(model_inputs)}; grpo_kit trains "
            "vision-language models whose processor gives pixel_values and image_grid_thw (Qwen2-VL, Qwen2.5-VL, "
            "Qwen3-VL). Open an issue with the model's name to have another layout supported."
        )


def per_row(model_inputs: dict[str, torch.Tensor], images_per_row: list[int]) -> dict[str, torch.Tensor]:
    """The processor's `pixel_values` (patches, C) and `image_grid_thw` (images, 3) of a batch, as (N, P, C) and
    (N, I, 3): each row's own images' patches and grids, zero-padded."""
    grids = model_inputs["image_grid_thw"]  # (images, 3)
    patches = model_inputs["pixel_values"]  # (patches, C)
    grids_of_rows = grids.split(images_per_row)  # N x (I_n, 3)
    patches_of_rows = patches.split([int(rows.prod(dim=-1).sum()) for rows in grids_of_rows])  # N x (P_n, C)
    padded_grids = torch.nn.utils.rnn.pad_sequence(list(grids_of_rows), batch_first=True)  # (N, I, 3)
    padded_patches = torch.nn.utils.rnn.pad_sequence(list(patches_of_rows), batch_first=True)  # (N, P, C)
    return {"pixel_values": padded_patches, "image_grid_thw": padded_grids}


def model_kwargs(batch: MicroBatch, input_ids: torch.Tensor, model) -> dict[str, torch.Tensor]:
    """What `model`'s forward pass takes for the images of `batch`'s rows, whose tokens are `input_ids` (B, W):
    nothing for a batch without images."""
    if batch.image_grid_thw is None:
        return {}
    grids = batch.image_grid_thw  # (B, I, 3)
    images = grids.prod(dim=-1) > 0  # (B, I) the real images
    if not images.any():  # rows of text-only prompts: the model takes no image inputs
        return {}
    patches = grids.prod(dim=-1).sum(dim=-1)  # (B,)
    real = torch.arange(batch.pixel_values.shape[1], device=patches.device) < patches[:, None]  # (B, P)
    return {
        "pixel_values": batch.pixel_values[real],  # (patches, C), in row order as the processor gives them
        "image_grid_thw": grids[images],  # (images, 3)
        **image_token_types(model, input_ids),
    }
