"""Under mixed precision, the linear layers' weights cast once per generation batch instead of at every token.

accelerate runs a mixed-precision model's forward inside an autocast that opens and closes at every call, and autocast
keeps its casts of the weights only while it is open: every decode step casts every float32 weight of every linear
layer again (242 casts per step for Qwen2.5-0.5B's shape, about 3 GB read and written per token). In this context each
linear layer multiplies by a copy of its weight and bias in autocast's precision, made once on entry and dropped on
exit, so that the memory is free again for training. The values are those of autocast's own casts (the same rounding),
and the layers that autocast casts are the only ones changed: embeddings and norms read their float32 weights as
before. A linear layer whose forward an instance already replaced (model.cast_lm_head_to_fp32's head) keeps it.
"""

import contextlib
import functools

import torch
from torch import nn


@contextlib.contextmanager
def weights_cast_once(model: nn.Module, device_type: str, dtype: torch.dtype | None):
    """While in this context, `model` samples with its linear weights cast to `dtype` once, under one autocast to
    `dtype` held open; `dtype` None (no mixed precision) changes nothing."""
    if dtype is None:
        yield
        return
    copies: dict[nn.Parameter, torch.Tensor] = {}  # by parameter: a weight tied to another layer is cast once
    patched = []
    for module in model.modules():
        if not isinstance(module, nn.Linear) or "forward" in vars(module) or module.weight.dtype != torch.float32:
            continue
        for parameter in (module.weight, module.bias):
            if parameter is not None and parameter not in copies:
                copies[parameter] = parameter.detach().to(dtype)
        bias = None if module.bias is None else copies[module.bias]
        module.forward = functools.partial(nn.functional.linear, weight=copies[module.weight], bias=bias)
        patched.append(module)
    try:
        with torch.autocast(device_type, dtype=dtype):
            yield
    finally:
        for module in patched:
            del module.forward


def autocast_dtype(accelerator) -> torch.dtype | None:
    """The precision accelerate's autocast runs the model's forward in, or None without mixed precision."""
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(str(accelerator.mixed_precision))
