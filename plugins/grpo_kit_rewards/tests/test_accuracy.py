import threading

import pytest

from grpo_kit_rewards.accuracy import Accuracy
from grpo_kit_rewards.configs import AccuracyConfig

accuracy = Accuracy(AccuracyConfig())


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


def test_trl_documented_example():
    solutions = [r"\frac{1}{3}", r"\frac{1}{3}"]
    completions = [
        [{"role": "assistant", "content": r"My answer is \boxed{\frac{1}{3}}"}],
        [{"role": "assistant", "content": r"My answer is \boxed{\frac{1}{2}}"}],
    ]
    assert accuracy(["q", "q"], completions, [[0], [0]], solution=solutions) == [1.0, 0.0]


def test_chat_completions_use_the_last_message():
    completions = [[{"role": "assistant", "content": "$\\boxed{3}$"}]]
    assert accuracy([[{"role": "user", "content": "1+2?"}]], completions, [[0]], solution=["3"]) == [1.0]


def test_gold_answers_from_another_column_and_numbers():
    reward = Accuracy(AccuracyConfig(solution_column="answer"))
    assert reward(["q", "q"], ["12", "13"], [[0], [0]], answer=[12, 12]) == [1.0, 0.0]


def test_missing_gold_column_says_which_option_to_set():
    with pytest.raises(ValueError, match=r"column named 'solution'.*columns: answer.*reward.accuracy.solution_column"):
        accuracy(["q"], ["12"], [[0]], answer=["12"])


def test_off_the_main_thread_without_math_verify_notices(monkeypatch, caplog):
    import math_verify.grader
    import math_verify.parser

    # math-verify shows its "Timeout is disabled" notice once per process: make sure it would show here.
    monkeypatch.setattr(math_verify.parser, "TIMEOUT_WARNING_SHOWN", False)
    monkeypatch.setattr(math_verify.grader, "TIMEOUT_WARNING_SHOWN", False)
    results = []
    thread = threading.Thread(target=lambda: results.append(accuracy(["q"], ["$13$"], [[0]], solution=["$12.5$"])))
    thread.start()
    thread.join()
    assert results == [[0.0]]
    assert not [record for record in caplog.records if record.name.startswith("math_verify")]
