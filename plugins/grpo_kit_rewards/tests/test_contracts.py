"""Every built-in reward against the conformance kit (grpo_kit.testing.contracts)."""

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForSequenceClassification

from grpo_kit.embedded import build_tokenizer
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


def tiny_reward_model(directory):
    """A random one-layer sequence classifier with the embedded tokenizer and a chat template it can read."""
    tokenizer = build_tokenizer()
    tokenizer.chat_template = "{% for message in messages %}{{ message['content'] }}={% endfor %}"
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        num_labels=1,
        pad_token_id=tokenizer.pad_token_id,
    )
    Qwen2ForSequenceClassification(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def test_every_reward_is_checked():
    assert_contracts_cover("grpo-kit-rewards", globals())
