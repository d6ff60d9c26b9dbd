"""The built-ins come through the entry point, and their options work from the command line."""

import math

import pytest

import grpo_kit
from grpo_kit.config.compose import options
from grpo_kit.rollout.scoring import Scorer

BUILT_INS = {
    "accuracy",
    "reasoning_accuracy",
    "think_format",
    "cosine_scaled",
    "repetition_penalty",
    "soft_overlong",
    "python",
    "reward_model",
    "judge",
    "code_execution",
    "environment",
}


def test_every_built_in_is_registered(registry):
    assert BUILT_INS <= set(registry.names("reward"))
    assert registry.get("reward", "accuracy").distribution.startswith("grpo-kit-rewards ")


def test_options_from_the_command_line(registry):
    cfg = grpo_kit.compose(
        [
            "+reward=[soft_overlong,cosine_scaled,python]",
            "generation.max_completion_length=100",
            "reward.soft_overlong.soft_punish_cache=20",
            "reward.python.function=grpo_kit_rewards.think_format:think_format",
            "reward.cosine_scaled.weight=0.5",
        ],
        registry,
    )
    assert cfg.reward.cosine_scaled.weight == 0.5
    rewards = {name: registry.build("reward", name, options(node)) for name, node in cfg.reward.items()}
    assert rewards["soft_overlong"].max_completion_len == 100  # defaults to generation.max_completion_length
    assert rewards["cosine_scaled"].max_len == 100
    with Scorer(rewards, workers=1) as scorer:
        matrix, _ = scorer(["q", "q"], ["<think>x</think>", "1"], [[1] * 90, [1] * 10], {"solution": ["1", "1"]})
    wrong_at_90 = -0.5 - 0.25 * (1 + math.cos(0.9 * math.pi))
    right_at_10 = 0.5 + 0.25 * (1 + math.cos(0.1 * math.pi))
    assert matrix.flatten().tolist() == pytest.approx([-0.5, wrong_at_90, 1.0, 0.0, right_at_10, 0.0])
