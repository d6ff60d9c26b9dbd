"""Registers this distribution's plugins; the `grpo_kit` entry point in pyproject.toml names this module.

Each hook registers plugins of one kind: `register(name, "package.module:Class", Config)`. The name is what users
type (`+loss=gpg`, `advantage=gpg`, `+reward=regex_format`, `+hook=reward_target`, `+sampler=failure_replay`); the
config dataclass's fields become their options. The class is named by its import path and imported only when a run
builds it: grpo_kit imports this module for every `grpo-kit` command and every composed run, so it must not import
torch (the kit's contract tests check that). For the same reason the traits the core checks a run's choices with
before building anything (`accumulation_invariant=True`, `needs_groups=True`, `uses_rewards=True`) are declared
here, and only here: the class does not repeat them, and a run hands them to the object it builds.
"""

import grpo_kit
from grpo_kit_example.configs import FailureReplayConfig, GPGAdvantageConfig, RegexFormatConfig, RewardTargetConfig


@grpo_kit.hookimpl
def register_losses(register):
    # No config: no options. The token mean spans the whole batch, so the gradient is the same however the batch is
    # split into micro-batches (the kit checks it).
    register("gpg", "grpo_kit_example.gpg_loss:GPG", accumulation_invariant=True)


@grpo_kit.hookimpl
def register_advantages(register):
    # It compares the completions of one prompt: a run needs generation.num_generations >= 2.
    register("gpg", "grpo_kit_example.gpg_advantage:GPGAdvantage", GPGAdvantageConfig, needs_groups=True)


@grpo_kit.hookimpl
def register_rewards(register):
    register("regex_format", "grpo_kit_example.regex_format:RegexFormat", RegexFormatConfig)


@grpo_kit.hookimpl
def register_hooks(register):
    # +hook=reward_target hook.reward_target.target=0.5
    register("reward_target", "grpo_kit_example.reward_target:RewardTarget", RewardTargetConfig)


@grpo_kit.hookimpl
def register_samplers(register):
    # Its draws depend on the rewards it is told: asynchronous generation, which draws ahead of them, is refused.
    register("failure_replay", "grpo_kit_example.failure_replay:FailureReplay", FailureReplayConfig, uses_rewards=True)
