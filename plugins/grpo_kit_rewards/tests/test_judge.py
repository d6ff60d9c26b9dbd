"""The judge reward against a real OpenAI-compatible HTTP server (conftest.py): scores, retries, timeouts, garbage,
a server that is down, under both failure policies; and a template naming a missing column, refused at start."""

import socket
import time

import datasets
import pytest

from grpo_kit import ConfigError, RewardError
from grpo_kit.rollout.checks import check_reward_columns
from grpo_kit.rollout.scoring import Scorer

PROMPTS, COMPLETIONS = ["3+4=", "1+1=", "9+9="], ["7", "3", "18"]


def build_judge(registry, url, **options):
    defaults = {"base_url": url, "model": "judge", "template": "{prompt}{completion}", "score_max": 1}
    return registry.build("reward", "judge", defaults | options)


def scored(reward, prompts=PROMPTS, completions=COMPLETIONS, columns=None):
    with Scorer({"judge": reward}, timeout=30.0, workers=0) as scorer:
        scores = scorer.score(prompts, completions, [[1]] * len(prompts), columns or {})
    return scores.rewards[:, 0].tolist(), scores.metrics


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_the_judge_scores_each_completion(registry, judge, api):
    values, metrics = scored(build_judge(registry, judge.url, api=api))
    assert values == [1.0, 0.0, 1.0]
    assert metrics["rewards/judge/failed_rows"] == 0 and metrics["rewards/judge/failures"] == 0
    assert judge.requests == 3


def test_a_template_fills_in_dataset_columns_and_scales_the_score(registry, judge):
    reward = build_judge(registry, judge.url, template="{prompt}{answer}", score_min=-1, score_max=1)
    values, _ = scored(reward, columns={"answer": ["7", "2", "0"]})
    assert values == [1.0, 1.0, 0.5]  # verdicts 1, 1, 0 on [-1, 1]


def test_a_busy_judge_is_asked_again(registry, judge):
    judge.behaviour, judge.failures = "busy", 2
    values, metrics = scored(
        build_judge(registry, judge.url, retries=2, retry_delay_s=0.01, concurrency=1), PROMPTS[:1], COMPLETIONS[:1]
    )
    assert values == [1.0] and metrics["rewards/judge/failed_rows"] == 0
    assert judge.requests == 3


def test_a_judge_busy_past_its_retries_scores_zero_and_is_counted(registry, judge):
    judge.behaviour, judge.failures = "busy", 10
    values, metrics = scored(
        build_judge(registry, judge.url, retries=1, retry_delay_s=0.01, concurrency=1), PROMPTS[:2], COMPLETIONS[:2]
    )
    assert values == [0.0, 0.0] and metrics["rewards/judge/failed_rows"] == 2
    assert judge.requests == 4


def test_a_slow_judge_times_out(registry, judge):
    judge.behaviour, judge.delay_s = "slow", 1.0
    values, metrics = scored(build_judge(registry, judge.url, timeout_s=0.2, retries=0), PROMPTS[:1], COMPLETIONS[:1])
    assert values == [0.0] and metrics["rewards/judge/failed_rows"] == 1


def test_a_garbage_answer_scores_zero_and_is_counted(registry, judge):
    judge.behaviour = "garbage"
    values, metrics = scored(build_judge(registry, judge.url))
    assert values == [0.0, 0.0, 0.0] and metrics["rewards/judge/failed_rows"] == 3


def test_a_score_out_of_range_is_a_failure(registry, judge):
    values, metrics = scored(build_judge(registry, judge.url, score_min=2, score_max=10))  # verdicts 0 and 1
    assert values == [0.0, 0.0, 0.0] and metrics["rewards/judge/failed_rows"] == 3


def test_a_garbage_answer_stops_the_run_when_told_to(registry, judge):
    judge.behaviour = "garbage"
    with pytest.raises(RewardError, match="no score for 3 of 3 completions.*I cannot tell"):
        scored(build_judge(registry, judge.url, on_failure="stop"))


@pytest.mark.parametrize("broken", ["json", "html", "utf8", "truncated", "status"])
def test_a_malformed_answer_fails_its_own_row_alone_and_is_asked_again(registry, judge, broken):
    """Each used to escape the reward and wipe the whole batch to None, whatever on_failure said."""
    judge.behaviour, judge.broken, judge.failures = "broken", broken, 1
    reward = build_judge(registry, judge.url, retries=0, concurrency=1)
    values, metrics = scored(reward)
    assert values == [0.0, 0.0, 1.0] and metrics["rewards/judge/failed_rows"] == 1  # row 0 broke, row 1 is wrong
    assert metrics["rewards/judge/failures"] == 0
    judge.failures = 1
    assert scored(build_judge(registry, judge.url, retries=1, retry_delay_s=0.01, concurrency=1))[0] == [1.0, 0.0, 1.0]
    judge.failures = 1
    with pytest.raises(RewardError, match="no score for 1 of 3 completions"):
        scored(build_judge(registry, judge.url, retries=0, concurrency=1, on_failure="stop"))


def test_a_redirect_is_never_followed_and_the_key_goes_to_no_other_host(registry, judge, judge_server_elsewhere):
    judge.behaviour, judge.redirect_to = "redirect", judge_server_elsewhere.url
    reward = build_judge(registry, judge.url, api_key="sk-judge", on_failure="stop", retries=0)
    with pytest.raises(RewardError, match="HTTP 302.*never followed"):
        scored(reward, PROMPTS[:1], COMPLETIONS[:1])
    assert judge.authorizations == ["Bearer sk-judge"] and judge_server_elsewhere.requests == 0


def test_timeout_s_bounds_the_whole_answer_and_its_size_is_capped(registry, judge):
    judge.behaviour, judge.delay_s = "trickle", 0.05  # about 150 bytes: 7 s in all, each byte well within 1 s
    started = time.monotonic()
    values, metrics = scored(build_judge(registry, judge.url, timeout_s=1, retries=0), PROMPTS[:1], COMPLETIONS[:1])
    assert values == [0.0] and metrics["rewards/judge/failed_rows"] == 1 and time.monotonic() - started < 3
    judge.behaviour = "huge"
    with pytest.raises(RewardError, match="larger than 1048576 bytes"):
        scored(build_judge(registry, judge.url, retries=0, on_failure="stop"), PROMPTS[:1], COMPLETIONS[:1])


def test_an_echoed_question_is_not_read_for_the_score(registry, judge):
    """The default template asks for a score "from 0 to 10": read in an echo, that 10 would be every row's score."""
    judge.behaviour = "echo"
    reward = build_judge(registry, judge.url, template="Score from 0 to 10: {prompt}{completion}", score_max=10)
    assert scored(reward)[0] == pytest.approx([0.1, 0.0, 0.1])  # verdicts 1, 0, 1 out of 10


@pytest.mark.parametrize("policy", ["zero", "stop"])
def test_a_judge_that_is_down(registry, policy):
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"
    reward = build_judge(registry, url, on_failure=policy, retries=1, retry_delay_s=0.01)
    if policy == "stop":
        with pytest.raises(RewardError, match="Connection refused|ConnectionRefused"):
            scored(reward)
    else:
        values, metrics = scored(reward)
        assert values == [0.0, 0.0, 0.0] and metrics["rewards/judge/failed_rows"] == 3


def test_a_template_naming_a_missing_column_is_refused_before_the_run(registry, judge):
    reward = build_judge(registry, judge.url, template="{prompt}{completion} (expected {gold})")
    dataset = datasets.Dataset.from_dict({"prompt": PROMPTS, "solution": ["7", "2", "18"]})
    with pytest.raises(ConfigError, match="'judge' needs the dataset column.*gold"):
        check_reward_columns({"judge": reward}, dataset)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"template": "{prompt.content}"}, "plain names only"),
        ({"template": "{prompt"}, "cannot be read"),
        ({"base_url": None}, "base_url"),
        ({"api": "responses"}, "not one of"),
        ({"on_failure": "ignore"}, "not one of"),
        ({"score_pattern": "("}, "not a regular expression"),
        ({"score_min": float("-inf")}, "finite score_min and score_max"),
        ({"base_url": "localhost:8000"}, "must start with http"),
    ],
)
def test_bad_options_are_refused_when_the_judge_is_built(registry, judge, options, message):
    with pytest.raises(ConfigError, match=message):
        build_judge(registry, judge.url, **options)
