"""Registers the built-in advantage estimators.

Each is named by import path and imported only when a run builds it, so listing the plugins and composing a run
import none of them, nor torch. All of them compare the completions of one prompt: `needs_groups`, which the core
checks a run's choices with, is declared here and nowhere else; Registry.build hands it to the built estimator.
"""

import grpo_kit


@grpo_kit.hookimpl
def register_advantages(register):
    register("group", "grpo_kit_advantages.group:GroupAdvantage", needs_groups=True)
    register("batch", "grpo_kit_advantages.batch:BatchAdvantage", needs_groups=True)
    register("none", "grpo_kit_advantages.none:CentredAdvantage", needs_groups=True)
    register("gdpo", "grpo_kit_advantages.gdpo:DecoupledAdvantage", needs_groups=True)
    register("rloo", "grpo_kit_advantages.rloo:LeaveOneOutAdvantage", needs_groups=True)
