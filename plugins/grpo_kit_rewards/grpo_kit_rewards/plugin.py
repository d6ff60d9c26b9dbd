"""Registers the built-in rewards, each with its options (configs.py)."""

import grpo_kit
from grpo_kit_rewards.accuracy import Accuracy
from grpo_kit_rewards.configs import (
    AccuracyConfig,
    CosineScaledConfig,
    PythonFunctionConfig,
    ReasoningAccuracyConfig,
    RepetitionPenaltyConfig,
    RewardModelConfig,
    SoftOverlongConfig,
)
from grpo_kit_rewards.cosine_scaled import CosineScaled
from grpo_kit_rewards.python_function import PythonFunction
from grpo_kit_rewards.reasoning_accuracy import ReasoningAccuracy
from grpo_kit_rewards.repetition_penalty import RepetitionPenalty
from grpo_kit_rewards.reward_model import RewardModel
from grpo_kit_rewards.soft_overlong import SoftOverlong
from grpo_kit_rewards.think_format import think_format


@grpo_kit.hookimpl
def register_rewards(register):
    register("accuracy", Accuracy, AccuracyConfig)
    register("reasoning_accuracy", ReasoningAccuracy, ReasoningAccuracyConfig)
    register("think_format", think_format)
    register("cosine_scaled", CosineScaled, CosineScaledConfig)
    register("repetition_penalty", RepetitionPenalty, RepetitionPenaltyConfig)
    register("soft_overlong", SoftOverlong, SoftOverlongConfig)
    register("python", PythonFunction, PythonFunctionConfig)
    register("reward_model", RewardModel, RewardModelConfig)
