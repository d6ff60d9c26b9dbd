"""The math rewards score plain-number answers without math-verify, exactly as math-verify would."""

import multiprocessing
import random

import pytest

from grpo_kit.rollout.scoring import Scorer
from grpo_kit_rewards.accuracy import Accuracy
from grpo_kit_rewards.configs import AccuracyConfig, CosineScaledConfig, ReasoningAccuracyConfig
from grpo_kit_rewards.cosine_scaled import CosineScaled
from grpo_kit_rewards.math_answers import is_correct
from grpo_kit_rewards.plain_answers import plain_verdict
from grpo_kit_rewards.reasoning_accuracy import ReasoningAccuracy

rng = random.Random(0)
INTEGERS = [str(n) for n in range(-12, 40)] + [str(rng.randint(-(10**15), 10**15)) for _ in range(10)]
OTHERS = ["012", "-0", "+5", "0.5", "0.50", "12.0", "007", "1e3", "3/4", " 12 ", "", "1 2", "1+2", "x", "$12$", "١٢"]


@pytest.mark.parametrize("gold", INTEGERS + OTHERS)
def test_a_plain_verdict_is_what_math_verify_says(gold):
    answers = INTEGERS + OTHERS + [gold, f" {gold}"]
    settled = [answer for answer in answers if plain_verdict(answer, gold) is not None]
    assert [plain_verdict(answer, gold) for answer in settled] == [is_correct(answer, gold) for answer in settled]


def test_plain_numbers_are_settled_and_the_rest_left_to_math_verify():
    assert (plain_verdict(" 12", "12"), plain_verdict("13", "12"), plain_verdict("0.5", "0.5")) == (1.0, 0.0, 1.0)
    assert plain_verdict("012", "12") is None and plain_verdict("0.50", "0.5") is None  # math-verify: right
    assert plain_verdict("$12$", "12") is None and plain_verdict("12", "\\frac{24}{2}") is None


REWARDS = {
    "accuracy": Accuracy(AccuracyConfig()),
    "reasoning_accuracy": ReasoningAccuracy(ReasoningAccuracyConfig()),
    "cosine_scaled": CosineScaled(CosineScaledConfig(max_len=8)),
}
COMPLETIONS = ["3", "4", "</think>3", "x</think> 4", "no delimiter", "$\\boxed{3}$", "03", "</think>$\\boxed{3}$"]


@pytest.mark.parametrize("name", REWARDS)
def test_quick_scores_are_those_of_a_full_call(name):
    reward = REWARDS[name]
    arguments = {
        "prompts": ["1+2="] * len(COMPLETIONS),
        "completions": COMPLETIONS,
        "completion_ids": [[0] * len(text) for text in COMPLETIONS],
        "solution": ["3"] * len(COMPLETIONS),
    }
    full, quick = reward(**arguments), reward.quick_scores(**arguments)
    assert quick and len(quick) < len(COMPLETIONS)  # some answers need math-verify
    assert quick == {row: full[row] for row in quick}


def test_a_batch_of_plain_answers_starts_no_worker_process():
    before = set(multiprocessing.active_children())
    with Scorer({"accuracy": REWARDS["accuracy"]}, workers=2) as scorer:
        scores, _ = scorer(["1+2="] * 3, ["3", "4", " 3"], [[0]] * 3, {"solution": ["3"] * 3})
        assert scores[:, 0].tolist() == [1.0, 0.0, 1.0]
        assert set(multiprocessing.active_children()) == before
        scores, _ = scorer(["1+2="] * 3, ["3", "$\\boxed{3}$", "03"], [[0]] * 3, {"solution": ["3"] * 3})
        assert scores[:, 0].tolist() == [1.0, 1.0, 1.0]  # the last two in the workers, started now
        assert set(multiprocessing.active_children()) - before
