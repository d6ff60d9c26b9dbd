"""Registers the in-process transformers generation backend, by import path: torch and transformers are imported
only when a run builds it. The trained model itself generates, so its log-probs are the trainer's up to rounding:
`samples_from_policy`, declared here and nowhere else."""

import grpo_kit
from grpo_kit_transformers.configs import TransformersGenerationConfig


@grpo_kit.hookimpl
def register_generations(register):
    register(
        "transformers",
        "grpo_kit_transformers.generation:TransformersGeneration",
        TransformersGenerationConfig,
        samples_from_policy=True,
    )
