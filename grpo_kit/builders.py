"""A run's plugins, built from its config: the advantage estimator and the rewards (the objective is built in
grpo_kit/objective.py, next to the code that calls its parts)."""

import torch
from omegaconf import DictConfig

from grpo_kit.config import options
from grpo_kit.errors import PluginError
from grpo_kit.plugins import Registry


def build_advantage(cfg: DictConfig, registry: Registry | None = None):
    """The advantage estimator: (N, K) rewards (NaN = None), (K,) weights, group size -> (N,) advantages."""
    registry = registry or Registry()
    estimator = registry.build("advantage", cfg.advantage.name, options(cfg.advantage))

    def advantages(rewards_per_func, weights, num_generations):
        # An unscorable completion (NaN) carries no signal: advantage 0, so it does not move the policy.
        return torch.nan_to_num(estimator(rewards_per_func, weights, num_generations), nan=0.0)

    return advantages


def build_rewards(cfg: DictConfig, registry: Registry) -> tuple[dict, torch.Tensor]:
    """The selected reward functions by their key under `reward` (their metric name), and their weights (K,).

    The key is the plugin's name (`+reward=accuracy`) unless the command line placed the plugin under another one
    (`+reward@reward.brevity=python`); the node's `name` says which plugin it is.
    """
    if not cfg.reward:
        raise PluginError(f"No reward selected: add +reward=NAME (installed: {', '.join(registry.names('reward'))}).")
    functions = {key: registry.build("reward", node.name, options(node)) for key, node in cfg.reward.items()}
    weights = torch.tensor([float(node.weight) for node in cfg.reward.values()])
    return functions, weights


def build_hooks(cfg: DictConfig, registry: Registry) -> list:
    """The hook plugins selected with `+hook=NAME` (or `+hook@hook.KEY=NAME`), built and checked."""
    return [registry.build("hook", node.name, options(node)) for node in cfg.hook.values()]
