"""Registers the verifiers rollout and reward, by import path: verifiers is imported only when a run selects them."""

import grpo_kit
from grpo_kit_verifiers.configs import VerifiersRewardConfig, VerifiersRolloutConfig


@grpo_kit.hookimpl
def register_rollouts(register):
    register("verifiers", "grpo_kit_verifiers.rollout:VerifiersRollout", VerifiersRolloutConfig)


@grpo_kit.hookimpl
def register_rewards(register):
    register("verifiers", "grpo_kit_verifiers.rewards:VerifiersReward", VerifiersRewardConfig)
