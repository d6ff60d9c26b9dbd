"""Registers the built-in losses, exactly as a third-party distribution would."""

import grpo_kit
from grpo_kit_losses.clipped import ClippedConfig
from grpo_kit_losses.dapo import DAPO
from grpo_kit_losses.grpo import GRPO


@grpo_kit.hookimpl
def register_losses(register):
    register("grpo", GRPO, ClippedConfig)
    register("dapo", DAPO, ClippedConfig)
