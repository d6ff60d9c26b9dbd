"""Registers the built-in importance-sampling levels and rollout corrections."""

import grpo_kit
from grpo_kit_importance.no_correction import NoCorrection
from grpo_kit_importance.token import TokenLevel


@grpo_kit.hookimpl
def register_importance_sampling(register):
    register("token", TokenLevel)


@grpo_kit.hookimpl
def register_rollout_corrections(register):
    register("none", NoCorrection)
