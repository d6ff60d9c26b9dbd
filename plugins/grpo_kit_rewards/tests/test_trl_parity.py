"""TRL's own reward functions, run through the `python` reward by import path, score as the built-ins do.

The `trl` fixture (conftest.py) skips them without trl==1.16.0, or fails them under GRPO_KIT_REQUIRE_TRL=1.
"""

import pytest

from grpo_kit.rollout.scoring import Scorer
from grpo_kit_rewards.accuracy import Accuracy
from grpo_kit_rewards.configs import (
    AccuracyConfig,
    CosineScaledConfig,
    PythonFunctionConfig,
    ReasoningAccuracyConfig,
    RepetitionPenaltyConfig,
    SoftOverlongConfig,
)
from grpo_kit_rewards.cosine_scaled import CosineScaled
from grpo_kit_rewards.python_function import PythonFunction
from grpo_kit_rewards.reasoning_accuracy import ReasoningAccuracy
from grpo_kit_rewards.repetition_penalty import RepetitionPenalty
from grpo_kit_rewards.soft_overlong import SoftOverlong
from grpo_kit_rewards.think_format import think_format

pytestmark = pytest.mark.usefixtures("trl")


def chat(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


# Boxed answers only: TRL's accuracy reads LaTeX after an anchor ("answer is", \boxed), ours reads plain answers too.
TEXTS = [
    r"<think>1/3?</think> The answer is \boxed{\frac{1}{3}}",
    r"<think>hmm</think> \boxed{\frac{1}{2}}",
    r"<think>no end \boxed{\frac{1}{3}}",
    r"<think>a<think>b</think> \boxed{\frac{1}{3}}",
    r"\boxed{0.3333333333} again again again again again",
    "",
]
SOLUTIONS = [r"\frac{1}{3}"] * 5 + ["not an answer"]
COMPLETION_IDS = [[1, 2, 3, 1, 2, 3], [5] * 150, [1, 2], list(range(90)), [4, 4, 4, 4], [7] * 120]

OURS_AND_TRLS = [
    (think_format, "trl.rewards:think_format_reward", None),
    (Accuracy(AccuracyConfig()), "trl.rewards:accuracy_reward", None),
    (ReasoningAccuracy(ReasoningAccuracyConfig()), "trl.rewards:reasoning_accuracy_reward", None),
    (
        SoftOverlong(SoftOverlongConfig(max_completion_len=100, soft_punish_cache=20)),
        "trl.rewards:get_soft_overlong_punishment",
        {"max_completion_len": 100, "soft_punish_cache": 20},
    ),
    (CosineScaled(CosineScaledConfig(max_len=100)), "trl.rewards:get_cosine_scaled_reward", {"max_len": 100}),
    (
        RepetitionPenalty(RepetitionPenaltyConfig(ngram_size=2, max_penalty=-0.5)),
        "trl.rewards:get_repetition_penalty_reward",
        {"ngram_size": 2, "max_penalty": -0.5},
    ),
]


@pytest.mark.parametrize(("ours", "path", "factory_kwargs"), OURS_AND_TRLS, ids=[p for _, p, _ in OURS_AND_TRLS])
def test_trl_reward_through_python_scores_like_ours(ours, path, factory_kwargs):
    trls = PythonFunction(PythonFunctionConfig(function=path, factory_kwargs=factory_kwargs))
    completions = [chat(text) for text in TEXTS]
    with Scorer({"ours": ours, "trl": trls}, workers=0) as scorer:
        rewards, metrics = scorer(["q"] * len(TEXTS), completions, COMPLETION_IDS, {"solution": SOLUTIONS})
    assert metrics == {"rewards/ours/failures": 0.0, "rewards/trl/failures": 0.0}
    ours_column, trls_column = rewards[:, 0].tolist(), rewards[:, 1].tolist()
    assert ours_column == pytest.approx(trls_column, nan_ok=True)
