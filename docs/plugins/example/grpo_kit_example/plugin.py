"""Registers this distribution's plugins; the `grpo_kit` entry point in pyproject.toml names this module.

Each hook registers plugins of one kind: `register(name, implementation, config)`. The name is what users type
(`+loss=gpg`, `advantage=gpg`, `+reward=regex_format`, `+hook=reward_target`); the config dataclass's fields become their options.
"""

import grpo_kit
from grpo_kit_example.gpg_advantage import GPGAdvantage, GPGAdvantageConfig
from grpo_kit_example.gpg_loss import GPG
from grpo_kit_example.regex_format import RegexFormat, RegexFormatConfig
from grpo_kit_example.reward_target import RewardTarget, RewardTargetConfig


@grpo_kit.hookimpl
def register_losses(register):
    register("gpg", GPG)  # no config: the loss has no options


@grpo_kit.hookimpl
def register_advantages(register):
    register("gpg", GPGAdvantage, GPGAdvantageConfig)


@grpo_kit.hookimpl
def register_rewards(register):
    register("regex_format", RegexFormat, RegexFormatConfig)


@grpo_kit.hookimpl
def register_hooks(register):
    register("reward_target", RewardTarget, RewardTargetConfig)  # +hook=reward_target hook.reward_target.target=0.5
