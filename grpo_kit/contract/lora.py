"""A LoRA policy, as a generation backend sees it: whether it has adapters, and a copy with them folded in.

`model.lora.enabled=true` makes the policy a PEFT model (grpo_kit/model/lora.py); a backend that samples from the
policy itself may generate from a merged copy instead, which costs what the plain model costs.
"""

import copy

import torch


def has_adapters(model: torch.nn.Module) -> bool:
    """Whether `model` (unwrapped: `accelerator.unwrap_model`) is a PEFT model with adapters around a base model."""
    return hasattr(model, "disable_adapter") and hasattr(model, "peft_config")


def merged_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A plain copy of a LoRA model with its adapters folded into the weights: generation then pays for no adapter.

    The training model is left alone: merging in place and unmerging after would round the base weights a little
    differently every step, and they must stay exactly the reference model.
    """
    return copy.deepcopy(model).merge_and_unload().eval().requires_grad_(False)


@torch.no_grad()
def refresh_merged_copy(model: torch.nn.Module, merged: torch.nn.Module) -> None:
    """Write the LoRA model's current W + (alpha / r) B A into the merged copy's weights."""
    from peft.tuners.lora import LoraLayer

    for name, module in model.get_base_model().named_modules():
        if isinstance(module, LoraLayer):
            delta = sum(module.get_delta_weight(adapter) for adapter in module.active_adapters)
            merged.get_submodule(name).weight.copy_(module.get_base_layer().weight + delta)
