"""Registers the built-in environments, by import path: each is imported only when a run selects it."""

import grpo_kit
from grpo_kit_environments.configs import CalculatorConfig


@grpo_kit.hookimpl
def register_environments(register):
    register("calculator", "grpo_kit_environments.calculator:Calculator", CalculatorConfig)
