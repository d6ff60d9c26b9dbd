"""Registers the built-in hook plugins."""

import grpo_kit
from grpo_kit_hooks.dynamic_sampling import DynamicSampling, DynamicSamplingConfig


@grpo_kit.hookimpl
def register_hooks(register):
    register("dynamic_sampling", DynamicSampling, DynamicSamplingConfig)
