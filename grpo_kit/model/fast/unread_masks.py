"""A masked pass's attention mask built without reading it back: no wait for the GPU.

Before building an SDPA mask, transformers asks whether it can leave the mask out (no padding at all, so that SDPA's
own causal flag suffices); the answer reads the padding mask's values on the host, twice per pass, and on a GPU each
read waits for every kernel queued before it. A masked pass of grpo_kit's has padding to mask wherever mask-free
passes are on (a micro-batch without any runs mask-free: mask_free.py), so the answer would be no: here the mask is
built as transformers builds it, without asking. With model.mask_free_passes=false, a micro-batch without padding
gets an all-causal mask instead of none: the same values, up to the rounding of another SDPA kernel.

When it applies: every pass with an attention mask over a model that runs SDPA (transformers' default).
"""

import contextlib
import functools

from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

UNREAD_SDPA = "grpo_kit_unread_sdpa"  # transformers' SDPA, registered under this name with `_sdpa_mask_unread`


def _sdpa_mask_unread(*args, **kwargs):
    return sdpa_mask(*args, **(kwargs | {"allow_is_causal_skip": False}))


@functools.cache
def register() -> None:
    AttentionInterface.register(UNREAD_SDPA, sdpa_attention_forward)
    AttentionMaskInterface.register(UNREAD_SDPA, _sdpa_mask_unread)


@contextlib.contextmanager
def masks_built_unread(model):
    """While in this context, a model that runs SDPA builds its masks without reading them (the model's config says
    which attention its layers call)."""
    config = model.config.get_text_config(decoder=True)
    if config._attn_implementation != "sdpa":
        yield
        return
    register()
    config._attn_implementation = UNREAD_SDPA
    try:
        yield
    finally:
        config._attn_implementation = "sdpa"
