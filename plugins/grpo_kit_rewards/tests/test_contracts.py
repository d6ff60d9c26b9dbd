"""Every built-in reward against the conformance kit (grpo_kit.testing.contracts)."""

import pytest

from grpo_kit.testing import build_tiny_reward_model
from grpo_kit.testing.contracts import RewardContract, assert_contracts_cover


class TestRewardsWithDefaultOptions(RewardContract):
    plugin_names = ("accuracy", "reasoning_accuracy", "think_format", "repetition_penalty")


class TestCosineScaled(RewardContract):
    plugin_name = "cosine_scaled"
    options = {"max_len": 4}  # in a run: ${generation.max_completion_length}


class TestSoftOverlong(RewardContract):
    plugin_name = "soft_overlong"
    options = {"max_completion_len": 2, "soft_punish_cache": 1}  # the contract's completions reach the ramp


class TestPythonFunction(RewardContract):
    plugin_name = "python"
    options = {"function": "grpo_kit_rewards.think_format:think_format"}


class TestRewardModel(RewardContract):
    plugin_name = "reward_model"

    @pytest.fixture(scope="class")
    @classmethod
    def plugin_options(cls, contract_case, tmp_path_factory):
        return {"path": str(tiny_reward_model(tmp_path_factory.mktemp("reward-model"))), "batch_size": 3}


class TestJudge(RewardContract):
    plugin_name = "judge"

    @pytest.fixture(scope="class")
    @classmethod
    def plugin_options(cls, contract_case, judge_server):  # a real OpenAI-compatible server (conftest.py)
        return {"base_url": judge_server.url, "model": "judge", "template": "{prompt}{completion}", "score_max": 1}


class TestCodeExecution(RewardContract):
    plugin_name = "code_execution"
    options = {"timeout_s": 2.0, "memory_mb": 256}
    columns = {"tests": ["assert True", ["assert 1 + 1 == 2", "assert False"], "assert x == 1", []]}


class Episode:
    def __init__(self, score):
        self.score = score

    def get_reward(self):
        return self.score


class TestEnvironmentReward(RewardContract):
    plugin_name = "environment"
    options = {"environment": "calculator"}  # in a run: the run's +environment
    columns = {"environments": [Episode(1.0), Episode(0.0), Episode(0.5), Episode(None)]}


def tiny_reward_model(directory):
    """A random one-layer sequence classifier with the embedded tokenizer and a chat template it can read."""
    return build_tiny_reward_model(
        directory, chat_template="{% for message in messages %}{{ message['content'] }}={% endfor %}"
    )


def test_every_reward_is_checked():
    assert_contracts_cover("grpo-kit-rewards", globals())
