"""Images in prompts: a dataset's `image` or `images` column, read, checked, and rendered with the model's processor.

A row's images are a PIL image, a path, bytes, or what a datasets `Image` feature holds undecoded ({"bytes",
"path"}); `images` holds a list of them. A chat prompt that places no image gets its row's images at the start of
its first user message, as TRL places them; a text prompt must hold the processor's image token once per image.
"""

import dataclasses
import io
import logging
from collections.abc import Callable
from pathlib import Path

import datasets
import PIL.Image
import torch

from grpo_kit.contract.errors import ConfigError
from grpo_kit.contract.kinds import Completions, PromptImages
from grpo_kit.model.vision import check_supported, per_row
from grpo_kit.rollout.prompts import IMAGE_COLUMNS, is_conversational

# About 6,300 x 6,300: 120 MB of RGB pixels, which a vision-language processor shrinks to a small share of anyway.
# PIL refuses only above 179 million pixels, and a 10,000 x 10,000 image took 2.6 GB to process.
MAX_IMAGE_PIXELS = 40_000_000

log = logging.getLogger(__name__)


def image_column(dataset: datasets.Dataset) -> str | None:
    """The dataset's image column, or None; both at once is ambiguous."""
    present = [name for name in IMAGE_COLUMNS if name in dataset.column_names]
    if len(present) > 1:
        raise ConfigError(
            "The dataset has both an `image` and an `images` column: keep one (`images` for several per prompt)."
        )
    return present[0] if present else None


def images_of(row: dict) -> list:
    """The row's images as they are stored (not yet opened): none, one, or a list."""
    if row.get("image") is not None:
        return [row["image"]]
    return list(row.get("images") or [])


def opened(image) -> PIL.Image.Image:
    """An image as RGB pixels, from a PIL image, a path, bytes, or a datasets `Image` feature's {"bytes", "path"}."""
    if isinstance(image, dict):
        image = image.get("bytes") or image.get("path")
    if isinstance(image, (str, Path)):
        path = Path(image).expanduser()
        if not path.is_file():  # reading a FIFO or a device would wait forever
            raise ValueError(f"{path} {'is not a regular file' if path.exists() else 'does not exist'}")
        image = PIL.Image.open(path)
    elif isinstance(image, (bytes, bytearray)):
        image = PIL.Image.open(io.BytesIO(image))
    if not isinstance(image, PIL.Image.Image):
        raise TypeError(f"{type(image).__name__} is no image: give a PIL image, a path or the image file's bytes")
    if image.width * image.height > MAX_IMAGE_PIXELS:  # known from the header, before the pixels are decoded
        raise ValueError(
            f"it is {image.width} x {image.height} pixels, more than {MAX_IMAGE_PIXELS:,}: shrink it (the model's "
            "processor would shrink it far more anyway)"
        )
    image.load()  # reads the whole file now: a truncated one fails here, not in the middle of training
    return image.convert("RGB")


def check_images(
    dataset: datasets.Dataset, source: str, image_token: str | None, image_processor: Callable | None = None
) -> None:
    """Every image of every row opens, `image_processor` (the model's) takes it, and each text prompt holds
    `image_token` once per image: a bad row would otherwise fail only when a batch draws it, and again after each
    resume. `image_token` None: the model reads no images, so none may be given."""
    column = image_column(dataset)
    if column is None:
        return
    if image_token is None:
        raise ConfigError(
            f"{source} has an `{column}` column, but the model reads no images. Use a vision-language model "
            "(Qwen2-VL, Qwen2.5-VL, Qwen3-VL), or remove the column."
        )
    for index in range(len(dataset)):
        row = dataset[index]
        try:
            images = [opened(image) for image in images_of(row)]
        except (OSError, TypeError, ValueError, PIL.Image.DecompressionBombError) as error:  # OSError: unidentified
            raise ConfigError(
                f"{source}: row {index + 1} (counting from 1), column `{column}`, holds an image that cannot be "
                f"read: {error}. Correct or drop that row."
            ) from None
        try:
            for image in images if image_processor is not None else ():
                image_processor(images=[image])
        except (ValueError, TypeError) as error:  # as Qwen2-VL's smart_resize refuses a 1 x 400 image
            raise ConfigError(
                f"{source}: row {index + 1} (counting from 1), column `{column}`, holds an image the model's image "
                f"processor refuses: {error}. Correct or drop that row."
            ) from None
        prompt, count = row["prompt"], len(images_of(row))
        if isinstance(prompt, str) and prompt.count(image_token) != count:
            raise ConfigError(
                f"{source}: row {index + 1} (counting from 1) has {count} image(s) in `{column}`, but its text prompt "
                f"holds the model's image token {image_token!r} {prompt.count(image_token)} time(s). Put the token "
                "where each image goes, or give the prompt as chat messages (the images then open the first user "
                "message)."
            )


def with_image_parts(prompt: list[dict], count: int) -> list[dict]:
    """A chat prompt whose messages place `count` images: as they are if any message has an image part, else with
    the images at the start of the first user message."""
    if count == 0 or any(
        isinstance(message["content"], list) and any(part.get("type") == "image" for part in message["content"])
        for message in prompt
    ):
        return prompt
    placed, messages = False, []
    for message in prompt:
        if message["role"] == "user" and not placed:
            content = message["content"]
            text = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
            message = message | {"content": [{"type": "image"}] * count + text}
            placed = True
        messages.append(message)
    return messages


class ImagePrompts:
    """Renders prompts with their images through a vision-language model's processor."""

    def __init__(self, processor, model_name: str, chat_template_kwargs: dict | None = None):
        self.processor, self.model_name = processor, model_name
        self.chat_template_kwargs = chat_template_kwargs or {}
        # The tokens that stand for an image's (or a video's) patches: the model reads them only beside pixels.
        self.placeholder_ids = [
            token
            for token in (getattr(processor, name, None) for name in ("image_token_id", "video_token_id"))
            if token is not None
        ]
        self.cut_completions = 0  # how many completions `cut_at_placeholders` has cut, for its one warning

    def text(self, row: dict) -> str:
        prompt = row["prompt"]
        if not is_conversational(prompt):
            return prompt
        messages = with_image_parts(prompt, len(images_of(row)))
        return self.processor.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **self.chat_template_kwargs
        )

    def encode(self, rows: list[dict]) -> tuple[list[list[int]], PromptImages | None]:
        """Each row's prompt ids, every image placeholder expanded as the model expects, and the rows' images; None
        for rows without any."""
        images = [[opened(image) for image in images_of(row)] for row in rows]
        texts = [self.text(row) for row in rows]
        if not any(images):
            return self.processor.tokenizer(texts, add_special_tokens=False).input_ids, None
        flat = [image for row_images in images for image in row_images]
        out = self.processor(text=texts, images=flat, add_special_tokens=False)
        model_inputs = {name: torch.as_tensor(out[name]) for name in ("pixel_values", "image_grid_thw") if name in out}
        check_supported(
            {name: value for name, value in out.items() if name.startswith(("pixel", "image"))}, self.model_name
        )
        return [list(ids) for ids in out["input_ids"]], PromptImages(images, model_inputs)

    def row_tensors(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        """The rows' image inputs laid out one row per completion (grpo_kit/model/vision.py), as the processor made
        them for generation; nothing for rows without images."""
        images = [[opened(image) for image in images_of(row)] for row in rows]
        if not any(images):
            return {}
        flat = [image for row_images in images for image in row_images]
        out = self.processor.image_processor(images=flat, return_tensors="pt")
        model_inputs = {name: out[name] for name in ("pixel_values", "image_grid_thw")}
        return per_row(model_inputs, [len(row_images) for row_images in images])

    def cut_at_placeholders(self, generated: Completions, pad_token_id: int) -> Completions:
        """`generated` with each completion that wrote an image placeholder token ended just before it, as cut off.

        The model reads such a token only with the pixels of an image, which a completion has none of: its forward
        pass would fail on the mismatch. The token and what follows are not trained on, and the reward sees the
        text before it."""
        written = (
            torch.isin(generated.completion_ids, torch.tensor(self.placeholder_ids)) & generated.completion_mask.bool()
        )
        if not written.any():
            return generated
        after = written.int().cumsum(dim=1) > 0  # (N, T) from the first placeholder on
        cut = written.any(dim=1)  # (N,)
        if self.cut_completions == 0:
            log.warning(
                "%d completion(s) wrote an image placeholder token, which the model cannot read without an image: "
                "each is ended before it, as cut off (its reward sees the text before it; the token is not trained "
                "on). This warning is shown once.",
                int(cut.sum()),
            )
        self.cut_completions += int(cut.sum())
        logps = generated.sampling_per_token_logps
        return dataclasses.replace(
            generated,
            completion_ids=generated.completion_ids.masked_fill(after, pad_token_id),
            completion_mask=generated.completion_mask.masked_fill(after, 0),
            is_truncated=generated.is_truncated | cut,
            sampling_per_token_logps=None if logps is None else logps.masked_fill(after, 0.0),
        )
