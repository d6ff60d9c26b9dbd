"""Registers the built-in rewards."""

import grpo_kit
from grpo_kit_rewards.accuracy import accuracy


@grpo_kit.hookimpl
def register_rewards(register):
    register("accuracy", accuracy)
