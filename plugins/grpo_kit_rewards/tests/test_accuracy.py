import pytest

from grpo_kit_rewards.accuracy import accuracy


@pytest.mark.parametrize(
    ("completion", "solution", "expected"),
    [
        ("12", "12", 1.0),
        (" 12 ", "12", 1.0),
        ("13", "12", 0.0),
        ("", "12", 0.0),
        ("0.5", "\\frac{1}{2}", 1.0),
        ("$\\frac{1}{2}$", "$0.5$", 1.0),
        ("The answer is $\\boxed{7}$.", "$7$", 1.0),
        ("12", "not an answer", None),
    ],
)
def test_accuracy(completion, solution, expected):
    assert accuracy(["q"], [completion], [[0]], solution=[solution]) == [expected]


def test_chat_completions_use_the_last_message():
    completions = [[{"role": "assistant", "content": "$\\boxed{3}$"}]]
    assert accuracy([[{"role": "user", "content": "1+2?"}]], completions, [[0]], solution=["3"]) == [1.0]
