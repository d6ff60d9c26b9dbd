"""The Scorer: rewards run concurrently, a slow or failing reward costs at most the timeout, a bad one stops the run."""

import asyncio
import logging
import math
import os
import time

import pytest
import torch

from grpo_kit.contract.advantages import weighted_rewards
from grpo_kit.contract.errors import PluginError, RewardError
from grpo_kit.plugins.registry import Registry, plugin_manager
from grpo_kit.rollout.scoring import Scorer, checked_weighted_rewards

PROMPTS = ["1+1=", "1+2=", "2+2="]
COMPLETIONS = ["2", "4", "4"]
COMPLETION_IDS = [[4], [6], [6]]
COLUMNS = {"solution": ["2", "3", "4"]}
SLACK_S = 0.5  # thread start-up and bookkeeping on a busy two-core machine


def score(scorer):
    return scorer(PROMPTS, COMPLETIONS, COMPLETION_IDS, COLUMNS)


def exact(prompts, completions, completion_ids, solution, **columns):
    return [1.0 if c == s else 0.0 for c, s in zip(completions, solution)]


def length(prompts, completions, completion_ids, **columns):
    return [len(ids) for ids in completion_ids]


def no_opinion_on_first(prompts, completions, completion_ids, **columns):
    return [None, *[0.5] * (len(completions) - 1)]


def test_matrix_has_one_column_per_reward_and_nan_for_none():
    with Scorer({"exact": exact, "length": length, "partial": no_opinion_on_first}) as scorer:
        rewards, metrics = score(scorer)
    assert rewards.dtype == torch.float32 and rewards.shape == (3, 3)
    assert rewards[:, 0].tolist() == [1.0, 0.0, 1.0]
    assert rewards[:, 1].tolist() == [1.0, 1.0, 1.0]
    assert math.isnan(rewards[0, 2]) and rewards[1:, 2].tolist() == [0.5, 0.5]
    assert metrics == {"rewards/exact/failures": 0.0, "rewards/length/failures": 0.0, "rewards/partial/failures": 0.0}


def test_numpy_like_results_and_bools_are_accepted():
    def as_tensor(completions, **kwargs):
        return torch.tensor([0.25] * len(completions))

    def as_bools(completions, solution, **kwargs):
        return [c == s for c, s in zip(completions, solution)]

    with Scorer({"tensor": as_tensor, "bools": as_bools}) as scorer:
        rewards, _ = score(scorer)
    assert rewards.tolist() == [[0.25, 1.0], [0.25, 0.0], [0.25, 1.0]]


def test_async_and_sync_rewards_run_concurrently():
    async def slow_async(completions, **kwargs):
        await asyncio.sleep(0.6)
        return [1.0] * len(completions)

    def slow_sync(completions, **kwargs):
        time.sleep(0.6)
        return [2.0] * len(completions)

    rewards = {"async_a": slow_async, "async_b": slow_async, "sync_a": slow_sync, "sync_b": slow_sync}
    with Scorer(rewards) as scorer:
        started = time.perf_counter()
        matrix, _ = score(scorer)
        elapsed = time.perf_counter() - started
    assert matrix[0].tolist() == [1.0, 1.0, 2.0, 2.0]
    assert elapsed < 0.6 * 2  # one after the other would take 2.4 s


def test_async_rewards_share_one_event_loop_across_batches():
    loops = []

    async def remembers_loop(completions, **kwargs):
        loops.append(asyncio.get_running_loop())
        return [0.0] * len(completions)

    with Scorer({"a": remembers_loop}) as scorer:
        score(scorer)
        score(scorer)
    assert loops[0] is loops[1]


def test_async_plugin_reward_bound_to_its_options(local_plugin):
    module = local_plugin(
        "async_scaled_reward",
        """
        import asyncio
        from dataclasses import dataclass
        import grpo_kit

        @dataclass
        class Options(grpo_kit.RewardConfig):
            scale: float = 1.0

        async def scaled(prompts, completions, completion_ids, scale, **columns):
            await asyncio.sleep(0)
            return [scale * len(c) for c in completions]

        @grpo_kit.hookimpl
        def register_rewards(register):
            register("scaled", scaled, Options)
    """,
    )
    reward = Registry(plugin_manager(local_modules=[module])).build("reward", "scaled", {"scale": 3.0})
    with Scorer({"scaled": reward}) as scorer:
        rewards, _ = score(scorer)
    assert rewards[:, 0].tolist() == [3.0, 3.0, 3.0]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_reward_past_its_timeout_costs_only_the_timeout(kind, caplog):
    def sleeps_sync(completions, **kwargs):
        time.sleep(5)
        return [1.0] * len(completions)

    async def sleeps_async(completions, **kwargs):
        await asyncio.sleep(5)
        return [1.0] * len(completions)

    sleeper = sleeps_sync if kind == "sync" else sleeps_async
    with Scorer({"sleeper": sleeper, "exact": exact}, timeout=0.3) as scorer:
        started = time.perf_counter()
        rewards, metrics = score(scorer)
        assert time.perf_counter() - started < 0.3 + SLACK_S
        score(scorer)  # a second failure is counted, not logged again
    assert rewards[:, 0].isnan().all() and rewards[:, 1].tolist() == [1.0, 0.0, 1.0]
    assert metrics["rewards/sleeper/failures"] == 1.0 and metrics["rewards/exact/failures"] == 0.0
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "'sleeper'" in r.getMessage()]
    assert len(warnings) == 1 and "timed out after 0.3 s" in warnings[0].getMessage()


def test_reward_that_raises_gives_none_and_is_counted(caplog):
    def broken(completions, **kwargs):
        raise ConnectionError("verifier service unreachable")

    with Scorer({"broken": broken, "exact": exact}) as scorer:
        rewards, metrics = score(scorer)
        _, metrics_again = score(scorer)
    assert rewards[:, 0].isnan().all() and rewards[:, 1].tolist() == [1.0, 0.0, 1.0]
    assert metrics["rewards/broken/failures"] == 1.0 and metrics_again["rewards/broken/failures"] == 1.0
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "verifier service unreachable" in warnings[0].getMessage()


def test_a_reward_with_no_opinion_on_a_whole_batch_is_warned_about_once(caplog):
    def abstains(completions, **kwargs):
        return [None] * len(completions)

    with Scorer({"abstains": abstains, "partial": no_opinion_on_first}) as scorer:
        rewards, _ = score(scorer)
        score(scorer)
    assert rewards[:, 0].isnan().all()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "Reward 'abstains' returned None (no opinion) for every completion" in warnings[0]


@pytest.mark.parametrize(
    ("returned", "message"),
    [
        ([1.0, 2.0], r"Reward 'bad' returned 2 values for 3 completions"),
        (1.0, r"Reward 'bad' returned a float for 3 completions"),
        ([1.0, "2", 3.0], r"Reward 'bad' returned '2' for completion 1: each value must be a finite number"),
        ([1.0, 2.0, float("nan")], r"Reward 'bad' returned nan for completion 2"),
        ([float("inf"), 2.0, 3.0], r"Reward 'bad' returned inf for completion 0"),
        ([1.0, 1e39, 3.0], r"Reward 'bad' returned 1e\+39 for completion 1, beyond float32's range"),
    ],
)
def test_unusable_results_stop_the_run(returned, message):
    with Scorer({"bad": lambda **kwargs: returned}) as scorer, pytest.raises(RewardError, match=message):
        score(scorer)


def test_a_weighted_sum_beyond_float32_stops_the_run():
    """Each reward and weight is within float32, their sum is not: the advantages would be NaN."""
    rewards = torch.tensor([[1.0, 3e38], [1.0, 0.0]])
    assert torch.isinf(weighted_rewards(rewards, torch.tensor([1.0, 2.0]))).any()
    with pytest.raises(RewardError, match=r"weighted sum of the rewards of completion 0 is inf.*Scale"):
        checked_weighted_rewards(rewards, torch.tensor([1.0, 2.0]))
    assert torch.isfinite(checked_weighted_rewards(rewards, torch.tensor([1.0, 0.5]))).all()


CPU_HEAVY_MODULE = """
    import os
    import time

    def pid_and_length(prompts, completions, completion_ids, **columns):
        return [os.getpid() % 1000 * 1000 + len(ids) for ids in completion_ids]  # exact in float32
    pid_and_length.cpu_heavy = True

    def sleeps_on_long(prompts, completions, completion_ids, **columns):
        if any(len(ids) > 1 for ids in completion_ids):
            time.sleep(30)
        return [1.0] * len(completions)
    sleeps_on_long.cpu_heavy = True
"""


def test_cpu_heavy_rewards_run_in_worker_processes_on_chunks(local_plugin):
    module = __import__(local_plugin("cpu_heavy_rewards", CPU_HEAVY_MODULE))
    completion_ids = [[1] * n for n in range(1, 6)]
    with Scorer({"pid": module.pid_and_length}, workers=2) as scorer:
        rewards, _ = scorer(["p"] * 5, ["c"] * 5, completion_ids, {})
    values = [int(v) for v in rewards[:, 0].tolist()]
    assert [v % 1000 for v in values] == [1, 2, 3, 4, 5]  # each chunk back in its place
    assert all(v // 1000 != os.getpid() % 1000 for v in values)


def test_stuck_worker_costs_only_the_timeout_and_is_replaced(local_plugin):
    module = __import__(local_plugin("cpu_heavy_sleeper", CPU_HEAVY_MODULE))
    with Scorer({"sleeper": module.sleeps_on_long}, timeout=1.0, workers=1) as scorer:
        assert scorer(["p"], ["c"], [[1]], {})[0].tolist() == [[1.0]]  # the worker is up
        started = time.perf_counter()
        rewards, metrics = scorer(["p"], ["c"], [[1, 2]], {})
        assert time.perf_counter() - started < 1.0 + SLACK_S
        assert rewards.isnan().all() and metrics["rewards/sleeper/failures"] == 1.0
        rewards, metrics = scorer(["p"], ["c"], [[1]], {})  # a fresh worker answers
    assert rewards.tolist() == [[1.0]] and metrics["rewards/sleeper/failures"] == 0.0


def test_cpu_heavy_reward_that_cannot_reach_a_worker_is_rejected():
    def local(completions, **kwargs):
        return [0.0] * len(completions)

    local.cpu_heavy = True
    with pytest.raises(PluginError, match=r"Reward 'local' declares cpu_heavy = True.*cannot be sent"):
        Scorer({"local": local})


def test_without_workers_cpu_heavy_rewards_run_in_threads():
    def local(completions, **kwargs):
        return [0.0] * len(completions)

    local.cpu_heavy = True  # not picklable, and that is fine: no process pool
    with Scorer({"local": local}, workers=0) as scorer:
        assert score(scorer)[0].tolist() == [[0.0], [0.0], [0.0]]


@pytest.mark.parametrize("workers", [0, 1])
def test_math_rewards_off_the_main_thread_and_in_workers(registry, workers, caplog):
    accuracy = registry.build("reward", "accuracy", {})
    with Scorer({"accuracy": accuracy}, workers=workers) as scorer:
        rewards, metrics = scorer(PROMPTS, ["2", "$\\boxed{3}$", "5"], COMPLETION_IDS, COLUMNS)
    assert rewards[:, 0].tolist() == [1.0, 1.0, 0.0] and metrics["rewards/accuracy/failures"] == 0.0
    assert not [r for r in caplog.records if "Timeout is disabled" in r.getMessage()]


def test_invalid_settings_are_named():
    with pytest.raises(ValueError, match="timeout > 0"):
        Scorer({}, timeout=0)
