"""Registers the built-in prompt samplers, by import path: each is imported only when a run selects it."""

import grpo_kit
from grpo_kit_samplers.configs import CurriculumConfig, DifficultyPoolConfig, SkipFlatGroupsConfig


@grpo_kit.hookimpl
def register_samplers(register):
    register("uniform", "grpo_kit_samplers.uniform:Uniform")
    pools = "grpo_kit_samplers.difficulty_pool:DifficultyPool"
    register("difficulty_pool", pools, DifficultyPoolConfig, uses_rewards=True)
    register("curriculum", "grpo_kit_samplers.curriculum:Curriculum", CurriculumConfig)
    skips = "grpo_kit_samplers.skip_flat_groups:SkipFlatGroups"
    register("skip_flat_groups", skips, SkipFlatGroupsConfig, uses_rewards=True)
