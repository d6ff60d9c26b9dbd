"""The transformers backend's options (`generation.FIELD=...`), apart from the backend, which imports torch and
transformers, so that listing the plugins and composing a run read them (and check them) without those."""

from dataclasses import dataclass
from typing import Any

from grpo_kit import GenerationConfig
from grpo_kit.contract.errors import ConfigError


@dataclass
class TransformersGenerationConfig(GenerationConfig):
    # lean: grpo_kit's own sampling loop (sampling.py), finished rows leaving the batch, for less on a CPU;
    # static: fixed shapes and no host sync inside a decode step (static.py), a CUDA graph on a GPU;
    # generate: transformers' `model.generate`, with all its options; auto: lean on a CPU, static on a CUDA GPU,
    # generate elsewhere. lean and static sample what `generate` samples (docs/training.md, "The GPU path").
    loop: str = "auto"
    cache_implementation: str | None = None  # loop=generate (auto then takes generate): e.g. "static"; None: dynamic
    generation_kwargs: Any = None  # a dict of GenerationConfig fields, applied last: it overrides the ones above too
    merge_lora: bool = False  # generate from a copy with the LoRA adapters merged into the weights
    # DeepSpeed ZeRO-3 only: gather the whole model for generation (fast); false gathers layer by layer, for a model
    # too big for one device's memory (slow). TRL's option of the same name.
    ds3_gather_for_generation: bool = True

    def __post_init__(self):
        if self.loop not in ("auto", "lean", "static", "generate"):
            raise ConfigError(f"generation.loop={self.loop!r} must be auto, lean, static or generate.")
        if self.cache_implementation is not None and self.loop in ("lean", "static"):
            raise ConfigError(
                f"generation.cache_implementation={self.cache_implementation!r} chooses the KV cache of transformers' "
                f"generate, which the {self.loop} loop does not call: add generation.loop=generate."
            )
        # transformers would refuse these only inside the first generate call, after the model has loaded.
        if not 0 < self.top_p <= 1:
            raise ConfigError(
                f"generation.top_p={self.top_p} must lie in (0, 1]: it samples from the most likely tokens whose "
                "probabilities add up to top_p. Use 1.0 to turn it off, or 0.95, say."
            )
        if self.top_k is not None and self.top_k < 0:
            raise ConfigError(
                f"generation.top_k={self.top_k} must be a positive number of tokens to sample from, or null (or 0) "
                "to turn top-k filtering off."
            )
        if self.min_p is not None and not 0 <= self.min_p <= 1:
            raise ConfigError(
                f"generation.min_p={self.min_p} must lie in [0, 1]: it drops the tokens less likely than min_p times "
                "the most likely one. Use null to turn it off, or 0.05, say."
            )
        if self.repetition_penalty <= 0:
            raise ConfigError(
                f"generation.repetition_penalty={self.repetition_penalty} must be positive: 1.0 leaves the "
                "probabilities as they are, and values above 1 (1.1, say) discourage repeated tokens."
            )
