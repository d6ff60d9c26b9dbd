"""Prompts with images, as vLLM 0.33 takes them: each image's placeholder collapsed to one token, the image beside.

The trainer's prompt ids hold each image's placeholder expanded, as the model's processor writes it (Qwen2-VL:
`<|vision_start|>` + N x `<|image_pad|>` + `<|vision_end|>`). vLLM expands it again itself: its multimodal processor
replaces, for each image in turn, the next occurrence of the image token with that image's N tokens
(vllm/multimodal/processing/processor.py: BaseMultiModalProcessor._apply_prompt_updates, with Qwen2-VL's
replacement in vllm/model_executor/models/qwen2_vl.py: Qwen2VLMultiModalProcessor._get_prompt_updates). An expanded
prompt would come out with 2N - 1 image tokens for one image, the rest read as text, and no error: so each run of
image tokens goes to vLLM as a single one.
"""

import base64
import io

from grpo_kit.contract.errors import ConfigError


def image_token_id(model) -> int:
    """The token that stands for an image in the model's prompts (Qwen2-VL's config names it `image_token_id`)."""
    token = getattr(getattr(model, "config", None), "image_token_id", None)
    if token is None:
        raise ConfigError(
            f"The policy ({type(model).__name__}) names no image token in its config (`image_token_id`), so the vLLM "
            "backends cannot tell where its prompts place their images: they send images for Qwen2-VL-style models."
        )
    return token


def collapse_image_placeholders(prompt_ids: list[int], image_token: int, num_images: int) -> list[int]:
    """`prompt_ids` with each run of `image_token` cut to one token: the prompt vLLM expands for `num_images`."""
    collapsed = [
        token
        for index, token in enumerate(prompt_ids)
        if token != image_token or index == 0 or prompt_ids[index - 1] != image_token
    ]
    placeholders = collapsed.count(image_token)
    if placeholders != num_images:
        raise ValueError(
            f"A prompt comes with {num_images} image(s) but holds {placeholders} run(s) of image tokens (id "
            f"{image_token}): each image needs its placeholder in the prompt, in the order of the images. Build the "
            "prompts with the model's processor, from a prompt that names each image once."
        )
    return collapsed


def data_url(image) -> str:
    """A PIL image as the base64 PNG data URL vLLM loads (vllm/multimodal/media/connector.py:
    MediaConnector._load_data_url takes `data:<media type>;base64,<data>` alone). PNG keeps every pixel."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")
