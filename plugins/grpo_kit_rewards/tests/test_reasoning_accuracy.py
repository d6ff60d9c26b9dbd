import pytest

from grpo_kit_rewards.configs import ReasoningAccuracyConfig
from grpo_kit_rewards.reasoning_accuracy import ReasoningAccuracy

reasoning_accuracy = ReasoningAccuracy(ReasoningAccuracyConfig())


def test_trl_documented_example():
    solutions = [r"\frac{1}{3}", r"\frac{1}{3}", r"\frac{1}{3}"]
    texts = [
        r"<think> Reasoning content </think> The final answer is \boxed{\frac{1}{3}}",
        r"<think> Reasoning content </think> The final answer is \boxed{\frac{1}{2}}",
        r"<think> Reasoning content with partial answers \boxed{\frac{1}{3}} but no final answer",
    ]
    completions = [[{"role": "assistant", "content": text}] for text in texts]
    assert reasoning_accuracy(["q"] * 3, completions, [[0]] * 3, solution=solutions) == [1.0, 0.0, 0.0]


@pytest.mark.parametrize(
    ("completion", "solution", "expected"),
    [
        ("<think>7? no, 12</think>12", "12", 1.0),
        ("<think>the answer is 12</think>13", "12", 0.0),  # only the part after the reasoning counts
        ("<think>a</think>b</think> 12", "12", 1.0),  # after the last delimiter
        ("12", "12", 0.0),  # no delimiter: unfinished reasoning, penalised rather than skipped
        ("no delimiter", "not an answer", 0.0),
        ("<think>a</think> 12", "not an answer", None),
    ],
)
def test_reasoning_accuracy(completion, solution, expected):
    assert reasoning_accuracy(["q"], [completion], [[0]], solution=[solution]) == [expected]


def test_first_listed_delimiter_found_wins():
    reward = ReasoningAccuracy(ReasoningAccuracyConfig(reasoning_delimiters=["<|end_of_thought|>", "</think>"]))
    completion = "thinking</think> 5 <|end_of_thought|> 7"
    assert reward(["q"], [completion], [[0]], solution=["7"]) == [1.0]
    assert reward(["q"], ["thinking</think> 7"], [[0]], solution=["7"]) == [1.0]
