"""Registers the in-process transformers generation backend."""

import grpo_kit
from grpo_kit_transformers.generation import TransformersGeneration, TransformersGenerationConfig


@grpo_kit.hookimpl
def register_generations(register):
    register("transformers", TransformersGeneration, TransformersGenerationConfig)
