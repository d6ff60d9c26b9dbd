"""A run's plugins, built from its config: the advantage estimator, the rewards, the hooks, and what a rollout
calls (tools, an environment, a custom rollout). The objective is built in grpo_kit/objective/objective.py, next to
the code that calls its parts."""

import torch
from omegaconf import DictConfig

from grpo_kit.config.compose import check_rewards_chosen, options
from grpo_kit.contract.errors import ConfigError
from grpo_kit.plugins.registry import Registry
from grpo_kit.rollout.tool_use import ToolUse, check_tool, environment_tools, tool_functions


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
    check_rewards_chosen(cfg, registry)
    functions = {key: registry.build("reward", node.name, options(node)) for key, node in cfg.reward.items()}
    weights = torch.tensor([float(node.weight) for node in cfg.reward.values()])
    return functions, weights


def build_hooks(cfg: DictConfig, registry: Registry) -> list:
    """The hook plugins selected with `+hook=NAME` (or `+hook@hook.KEY=NAME`), built and checked."""
    return [registry.build("hook", node.name, options(node)) for node in cfg.hook.values()]


def build_tool_use(
    cfg: DictConfig, registry: Registry, tokenizer, generation, accelerator, eos_token_ids: list[int]
) -> ToolUse | None:
    """The multi-turn loop when the run has tools (`tools=[...]`) or an environment (`+environment=NAME`)."""
    if not cfg.tools and cfg.environment is None:
        return None
    if cfg.rollout is not None:
        raise ConfigError(
            f"+rollout={cfg.rollout.name} generates by itself, so it would never call the run's tools: drop "
            "+environment / tools=[...], or call them inside the rollout plugin."
        )
    environment = None
    if cfg.environment is not None:
        name, values = cfg.environment.name, options(cfg.environment)

        def environment():
            return registry.build("environment", name, values)

        for tool in environment_tools(environment()):
            check_tool(tool, f"+environment={name}")
    algo = cfg.algorithm
    return ToolUse(
        tokenizer,
        generation,
        accelerator,
        tool_functions(list(cfg.tools)),
        environment,
        cfg.generation.max_completion_length,
        algo.max_tool_calling_iterations,
        algo.tool_timeout,
        eos_token_ids,
    )


def build_custom_rollout(cfg: DictConfig, registry: Registry):
    """The rollout plugin's generation (`+rollout=NAME`), or None for the generation backend's own."""
    return None if cfg.rollout is None else registry.build("rollout", cfg.rollout.name, options(cfg.rollout))
