"""grpo_kit: GRPO-family reinforcement learning of language models, every variant a plugin.

The public API: `compose` a config as the CLI would, `build_objective` and `build_advantage` from it, `train`
it; plugin authors use `hookimpl` and the config and data types of `grpo_kit.kinds`.
"""

__version__ = "0.1.0"

from grpo_kit.builders import build_advantage
from grpo_kit.config import compose
from grpo_kit.errors import PluginError
from grpo_kit.hookspecs import hookimpl
from grpo_kit.kinds import Completions, GenerationConfig, Reduction, RewardConfig
from grpo_kit.objective import build_objective
from grpo_kit.plugins import Registry
from grpo_kit.trainer import train

__all__ = [
    "Completions",
    "GenerationConfig",
    "PluginError",
    "Reduction",
    "Registry",
    "RewardConfig",
    "build_advantage",
    "build_objective",
    "compose",
    "hookimpl",
    "train",
]
