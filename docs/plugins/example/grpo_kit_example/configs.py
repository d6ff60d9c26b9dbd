"""Every plugin's options: each field is a command-line option (`advantage.FIELD=`, `reward.regex_format.FIELD=`,
`hook.reward_target.FIELD=`), with its default.

plugin.py imports this module whenever grpo_kit lists the plugins or composes a run, so it imports no torch: the
options live here, apart from the plugins that compute with torch.
"""

from dataclasses import dataclass

import grpo_kit


@dataclass
class GPGAdvantageConfig:
    gradient_correction: bool = True  # multiply by alpha = B / (B - M), M the groups with no reward spread
    normalize_by_std: bool = False  # divide by the group's reward std (F_norm = std), as GRPO does; GPG uses 1


@dataclass
class RegexFormatConfig(grpo_kit.RewardConfig):  # a reward's config extends RewardConfig (it carries `weight`)
    pattern: str = r"\d+"  # a Python regular expression
    full_match: bool = True  # the whole completion must match; false: the pattern may match anywhere in it


@dataclass
class RewardTargetConfig:
    target: float = 0.5  # the mean logged reward to reach


@dataclass
class FailureReplayConfig:
    share: float = 0.25  # of each draw, at most, given to prompts whose last group fell below `below`
    below: float = 0.5  # a group whose mean reward is below this is a failure
