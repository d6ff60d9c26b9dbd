"""Registers the built-in advantage estimators."""

import grpo_kit
from grpo_kit_advantages.group import GroupAdvantage


@grpo_kit.hookimpl
def register_advantages(register):
    register("group", GroupAdvantage)
