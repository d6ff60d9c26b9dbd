"""Registers the built-in hook plugins, by import path: each is imported only when a run selects it."""

import grpo_kit
from grpo_kit_hooks.configs import DynamicSamplingConfig


@grpo_kit.hookimpl
def register_hooks(register):
    register("dynamic_sampling", "grpo_kit_hooks.dynamic_sampling:DynamicSampling", DynamicSamplingConfig)
