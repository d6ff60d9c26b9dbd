"""grpo_kit: GRPO-family reinforcement learning of language models, every variant a plugin.

The public API: `compose` a config as the CLI would, `build_objective` and `build_advantage` from it (an
objective takes a `MicroBatch`), `train` it. Plugin authors use `hookimpl`, the protocols and the config and data
types of `grpo_kit.contract.kinds`, the errors, and, in hooks, the `Run` and `ScoredBatch` of
`grpo_kit.contract.pipeline` (docs/plugins/README.md says which modules a plugin may import).
"""

__version__ = "0.1.0"

import importlib

from grpo_kit.config.compose import compose
from grpo_kit.contract.errors import ConfigError, GenerationUnavailable, PluginError, RewardError, UserError
from grpo_kit.contract.hookspecs import hookimpl
from grpo_kit.contract.kinds import (
    Advantage,
    Completions,
    CustomRollout,
    Environment,
    Generation,
    GenerationConfig,
    ImportanceSampling,
    LigerLoss,
    Loss,
    LossInputs,
    PromptImages,
    Reduction,
    Reward,
    RewardConfig,
    RolloutCorrection,
    RolloutResult,
    Sampler,
)
from grpo_kit.plugins.registry import Registry

# These load torch and transformers, so they are imported when first used, not with `import grpo_kit`: the CLI's
# help and errors, `grpo-kit plugins`, `compose` and every plugin's registration stay free of them.
_IMPORTED_ON_USE = {
    "MicroBatch": "grpo_kit.contract.micro_batch",
    "Run": "grpo_kit.contract.pipeline",
    "ScoredBatch": "grpo_kit.contract.pipeline",
    "build_advantage": "grpo_kit.training.builders",
    "build_objective": "grpo_kit.objective.objective",
    "eos_mask": "grpo_kit.contract.eos",
    "eos_token_ids": "grpo_kit.contract.eos",
    "is_truncated": "grpo_kit.contract.eos",
    "load_processor_at": "grpo_kit.model.loading",
    "train": "grpo_kit.training.loop",
}


def __getattr__(name: str):
    if name in _IMPORTED_ON_USE:
        return getattr(importlib.import_module(_IMPORTED_ON_USE[name]), name)
    raise AttributeError(f"module 'grpo_kit' has no attribute {name!r}")


__all__ = [
    "Advantage",
    "Completions",
    "ConfigError",
    "CustomRollout",
    "Environment",
    "Generation",
    "GenerationConfig",
    "GenerationUnavailable",
    "ImportanceSampling",
    "LigerLoss",
    "Loss",
    "LossInputs",
    "MicroBatch",
    "PluginError",
    "PromptImages",
    "Reduction",
    "Registry",
    "Reward",
    "RewardConfig",
    "RewardError",
    "RolloutCorrection",
    "RolloutResult",
    "Sampler",
    "Run",
    "ScoredBatch",
    "UserError",
    "build_advantage",
    "build_objective",
    "compose",
    "eos_mask",
    "eos_token_ids",
    "hookimpl",
    "is_truncated",
    "load_processor_at",
    "train",
]
