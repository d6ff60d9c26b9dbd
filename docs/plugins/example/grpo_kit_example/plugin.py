"""Registers this distribution's plugins; the `grpo_kit` entry point in pyproject.toml names this module.

Each hook registers plugins of one kind: `register(name, implementation, config)`. The name is what users type
(`+loss=gpg`, `advantage=gpg`, `+reward=regex_format`); the config dataclass's fields become their options.
"""

import grpo_kit
from grpo_kit_example.gpg_advantage import GPGAdvantage, GPGAdvantageConfig
from grpo_kit_example.gpg_loss import GPG
from grpo_kit_example.regex_format import RegexFormat, RegexFormatConfig


@grpo_kit.hookimpl
def register_losses(register):
    register("gpg", GPG)  # no config: the loss has no options


@grpo_kit.hookimpl
def register_advantages(register):
    register("gpg", GPGAdvantage, GPGAdvantageConfig)


@grpo_kit.hookimpl
def register_rewards(register):
    register("regex_format", RegexFormat, RegexFormatConfig)


# A hook plugin (`+hook=NAME`: a class whose `on_*` methods join the run) registers here the same way, with
# `register_hooks`; grpo_kit/hookspecs.py lists the hooks.
