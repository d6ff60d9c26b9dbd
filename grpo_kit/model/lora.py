"""LoRA adapters through PEFT: wrapping the policy, its adapter-free reference, and a merged copy for generation.

PEFT is optional (`pip install grpo-kit[lora]`); it is imported only by a run that turns LoRA on.

Public API for generation backends (docs/plugins/README.md, "What a plugin may import"): `has_adapters`, `merged_copy` and
`refresh_merged_copy`, for a backend that samples from the policy with its adapters folded in. The rest serves the
core's model setup.
"""

import copy
import importlib.util

import torch

from grpo_kit.config.compose import LoraConfig


def check_peft_installed() -> None:
    if importlib.util.find_spec("peft") is None:
        raise ModuleNotFoundError(
            "model.lora.enabled=true needs PEFT, which is not installed: pip install 'grpo-kit[lora]' (or peft)."
        )


def add_adapters(model: torch.nn.Module, cfg: LoraConfig) -> torch.nn.Module:
    """The model with trainable LoRA adapters on `cfg.target_modules` and every other weight frozen."""
    import peft

    target_modules = cfg.target_modules if isinstance(cfg.target_modules, str) else list(cfg.target_modules)
    config = peft.LoraConfig(
        r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=target_modules, task_type="CAUSAL_LM"
    )
    return peft.get_peft_model(model, config)


def has_adapters(model: torch.nn.Module) -> bool:
    return hasattr(model, "disable_adapter") and hasattr(model, "peft_config")


class AdapterFreeReference:
    """The reference model of a LoRA policy: the policy with its adapters turned off, which is the frozen base."""

    def __init__(self, policy: torch.nn.Module):
        self.policy = policy

    def __call__(self, **inputs):
        with self.policy.disable_adapter():
            return self.policy(**inputs)


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
