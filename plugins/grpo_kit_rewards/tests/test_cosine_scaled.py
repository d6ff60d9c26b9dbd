import pytest

from grpo_kit_rewards.configs import CosineScaledConfig
from grpo_kit_rewards.cosine_scaled import CosineScaled


def test_trl_documented_example():
    reward = CosineScaled(CosineScaledConfig(max_len=100))
    completions = [[{"content": r"\boxed{\frac{1}{3}}"}], [{"content": r"\boxed{\frac{1}{2}}"}]]
    solution = [r"\frac{1}{3}", r"\frac{1}{3}"]
    assert reward(["q", "q"], completions, [[1] * 50, [1] * 50], solution=solution) == pytest.approx([0.75, -0.75])


@pytest.mark.parametrize(
    ("answer", "tokens", "expected"),
    [
        ("7", 0, 1.0),  # right and short: max_value_correct
        ("7", 100, 0.5),  # right at max_len: min_value_correct
        ("7", 250, 0.5),  # past max_len the schedule stays at its end
        ("7", 25, 0.5 + 0.25 * (1 + 2**-0.5)),
        ("8", 0, -1.0),  # wrong and short: min_value_wrong
        ("8", 100, -0.5),  # wrong at max_len: max_value_wrong
    ],
)
def test_cosine_schedule(answer, tokens, expected):
    reward = CosineScaled(CosineScaledConfig(max_len=100))
    assert reward(["q"], [answer], [[1] * tokens], solution=["7"]) == [pytest.approx(expected)]


def test_unparsable_gold_gives_none():
    reward = CosineScaled(CosineScaledConfig(max_len=100))
    assert reward(["q"], ["7"], [[1]], solution=["no answer here"]) == [None]


def test_max_len_must_be_set():
    with pytest.raises(ValueError, match="max_len must be a positive number of tokens"):
        CosineScaled(CosineScaledConfig())  # outside a composed run the default cannot resolve
