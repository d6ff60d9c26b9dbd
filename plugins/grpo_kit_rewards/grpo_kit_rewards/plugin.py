"""Registers the built-in rewards, each with its options (configs.py).

Each reward is named by import path and imported only when a run builds it, so listing the plugins and composing
a run import none of them: not math-verify, nor torch.
"""

import grpo_kit
from grpo_kit_rewards.configs import (
    AccuracyConfig,
    CodeExecutionConfig,
    CosineScaledConfig,
    EnvironmentRewardConfig,
    JudgeConfig,
    PythonFunctionConfig,
    ReasoningAccuracyConfig,
    RepetitionPenaltyConfig,
    RewardModelConfig,
    SoftOverlongConfig,
)


@grpo_kit.hookimpl
def register_rewards(register):
    register("accuracy", "grpo_kit_rewards.accuracy:Accuracy", AccuracyConfig)
    register("reasoning_accuracy", "grpo_kit_rewards.reasoning_accuracy:ReasoningAccuracy", ReasoningAccuracyConfig)
    register("think_format", "grpo_kit_rewards.think_format:think_format")
    register("cosine_scaled", "grpo_kit_rewards.cosine_scaled:CosineScaled", CosineScaledConfig)
    register("repetition_penalty", "grpo_kit_rewards.repetition_penalty:RepetitionPenalty", RepetitionPenaltyConfig)
    register("soft_overlong", "grpo_kit_rewards.soft_overlong:SoftOverlong", SoftOverlongConfig)
    register("python", "grpo_kit_rewards.python_function:PythonFunction", PythonFunctionConfig)
    register("reward_model", "grpo_kit_rewards.reward_model:RewardModel", RewardModelConfig)
    register("judge", "grpo_kit_rewards.judge:Judge", JudgeConfig)
    register("code_execution", "grpo_kit_rewards.code_execution:CodeExecution", CodeExecutionConfig)
    register("environment", "grpo_kit_rewards.environment:EnvironmentReward", EnvironmentRewardConfig)
