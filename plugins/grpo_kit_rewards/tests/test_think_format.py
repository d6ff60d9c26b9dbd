import pytest

from grpo_kit_rewards.think_format import think_format


def test_trl_documented_example():
    completions = [
        [{"content": "<think>\nThis is my reasoning.\n</think>\nThis is my answer."}],
        [{"content": "<think>\nThis is my reasoning.\nThis is my answer."}],
    ]
    assert think_format(["q", "q"], completions, [[0], [0]]) == [1.0, 0.0]


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("<think>a</think>b", 1.0),
        ("<think></think>", 1.0),
        ("<think>\nstep 1\nstep 2\n</think>\n\nanswer\n", 1.0),
        ("<think>a<think>b</think>c", 0.0),  # a second opening tag
        ("<think>a</think>b<think>c</think>", 0.0),
        (" <think>a</think>b", 0.0),  # must open the completion
        ("answer <think>a</think>", 0.0),
        ("</think>", 0.0),
        ("", 0.0),
    ],
)
def test_think_format(completion, expected):
    assert think_format(["q"], [completion], [[0]]) == [expected]
