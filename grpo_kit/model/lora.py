"""LoRA adapters through PEFT: wrapping the policy, and its adapter-free reference.

PEFT is optional (`pip install grpo-kit[lora]`); it is imported only by a run that turns LoRA on. What a generation
backend needs of a LoRA policy (`has_adapters`, a merged copy) is in grpo_kit/contract/lora.py.
"""

import importlib.util
import re

import torch

from grpo_kit.config.schema import LoraConfig


def check_peft_installed() -> None:
    if importlib.util.find_spec("peft") is None:
        raise ModuleNotFoundError(
            "model.lora.enabled=true needs PEFT, which is not installed: pip install 'grpo-kit[lora]' (or peft)."
        )


def add_adapters(model: torch.nn.Module, cfg: LoraConfig, exclude: str | None = None) -> torch.nn.Module:
    """The model with trainable LoRA adapters on `cfg.target_modules` but none inside the module named `exclude`
    (a vision-language model's image encoder), and every other weight frozen."""
    import peft

    target_modules = cfg.target_modules if isinstance(cfg.target_modules, str) else list(cfg.target_modules)
    config = peft.LoraConfig(
        r=cfg.r,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=target_modules,
        exclude_modules=None if exclude is None else rf"{re.escape(exclude)}\..*",
        task_type="CAUSAL_LM",
    )
    return peft.get_peft_model(model, config)


class AdapterFreeReference:
    """The reference model of a LoRA policy: the policy with its adapters turned off, which is the frozen base."""

    def __init__(self, policy: torch.nn.Module):
        self.policy = policy

    def __call__(self, **inputs):
        with self.policy.disable_adapter():
            return self.policy(**inputs)
