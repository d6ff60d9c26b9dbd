"""Registers the built-in advantage estimators."""

import grpo_kit
from grpo_kit_advantages.batch import BatchAdvantage
from grpo_kit_advantages.gdpo import DecoupledAdvantage
from grpo_kit_advantages.group import GroupAdvantage
from grpo_kit_advantages.none import CentredAdvantage
from grpo_kit_advantages.rloo import LeaveOneOutAdvantage


@grpo_kit.hookimpl
def register_advantages(register):
    register("group", GroupAdvantage)
    register("batch", BatchAdvantage)
    register("none", CentredAdvantage)
    register("gdpo", DecoupledAdvantage)
    register("rloo", LeaveOneOutAdvantage)
