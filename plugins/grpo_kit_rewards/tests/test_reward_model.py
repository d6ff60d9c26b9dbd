"""A tiny sequence-classification reward model, built and saved here, scores prompts + completions."""

import pytest
import torch
from transformers import Qwen2ForSequenceClassification

from grpo_kit.embedded.sums import build_tokenizer
from grpo_kit.rollout.scoring import Scorer
from grpo_kit.testing import build_tiny_reward_model
from grpo_kit_rewards.configs import RewardModelConfig
from grpo_kit_rewards.reward_model import RewardModel

# The character tokenizer knows only digits, "+-*= " and its special tokens, so the template uses nothing else.
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}={% endfor %}"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_reward_model(tmp_path_factory.mktemp("reward-model"), chat_template=CHAT_TEMPLATE)


def unbatched(model_dir, texts: list[str]) -> list[float]:
    """Each text alone, with no padding: what the batched scores must equal."""
    model = Qwen2ForSequenceClassification.from_pretrained(model_dir).eval()
    tokenizer = build_tokenizer()
    with torch.inference_mode():
        return [model(**tokenizer(text, return_tensors="pt")).logits[0, 0].item() for text in texts]


def test_scores_text_prompt_plus_completion_in_batches(model_dir, registry):
    prompts, completions = ["1+2=", "3+4=", "12+30=", "5+5="], ["3", "7", "42", "1"]
    reward = registry.build("reward", "reward_model", {"path": str(model_dir), "batch_size": 3})
    expected = unbatched(model_dir, [p + c for p, c in zip(prompts, completions)])
    assert reward(prompts, completions, [[0]] * 4) == pytest.approx(expected, abs=1e-5)
    assert len(set(expected)) == 4  # the texts do get different scores


def test_chat_messages_go_through_the_reward_models_template(model_dir):
    prompts = [[{"role": "user", "content": "1+2"}], [{"role": "user", "content": "30+12"}]]
    completions = [[{"role": "assistant", "content": "3"}], [{"role": "assistant", "content": "42"}]]
    reward = RewardModel(RewardModelConfig(path=str(model_dir)))
    expected = unbatched(model_dir, ["1+2=3=", "30+12=42="])
    with Scorer({"reward_model": reward}) as scorer:
        rewards, _ = scorer(prompts, completions, [[0], [0]], {})
    assert rewards[:, 0].tolist() == pytest.approx(expected, abs=1e-5)


def test_max_length_keeps_the_end_of_the_text(model_dir):
    reward = RewardModel(RewardModelConfig(path=str(model_dir), max_length=3))
    assert reward(["1111+2="], ["3"], [[0]]) == pytest.approx(unbatched(model_dir, ["2=3"]), abs=1e-5)


def test_path_is_required():
    with pytest.raises(ValueError, match="reward.reward_model.path is not set"):
        RewardModel(RewardModelConfig())
