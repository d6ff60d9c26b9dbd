"""The environment's own reward (`+reward=environment`, its `get_reward`) and the `environments` keyword argument
every reward receives in a run with an environment, as TRL 1.16 hands them."""

import json
import math

import pytest

import grpo_kit
from grpo_kit import ConfigError, RewardError
from grpo_kit.config.compose import options
from grpo_kit.rollout.scoring import Scorer

SCORED_CALCULATOR = """
    import grpo_kit

    class ScoredCalculator:
        '''The calculator, scoring an episode 1.0 when it was called.'''

        def reset(self, **row):
            self.calls = 0

        def add(self, a: int, b: int) -> int:
            '''Add two integers.

            Args:
                a: The first number.
                b: The second number.
            '''
            self.calls += 1
            return a + b

        def get_reward(self):
            return float(self.calls > 0)

    def calls_seen(prompts, completions, completion_ids, environments, **columns):
        return [float(environment.calls) for environment in environments]

    @grpo_kit.hookimpl
    def register_environments(register):
        register("scored_calculator", ScoredCalculator)

    @grpo_kit.hookimpl
    def register_rewards(register):
        register("calls_seen", calls_seen)
"""


class Episode:
    def __init__(self, score):
        self.score = score

    def get_reward(self):
        return self.score


class AsyncEpisode(Episode):
    async def get_reward(self):
        return self.score


def environment_reward(registry, environment="calculator"):
    return registry.build("reward", "environment", {"environment": environment})


def test_the_environment_scores_each_completion_sync_or_async(registry):
    environments = [Episode(1.0), AsyncEpisode(0.5), Episode(None)]
    with Scorer({"environment": environment_reward(registry)}, workers=0) as scorer:
        scores = scorer.score(["q"] * 3, ["a"] * 3, [[1]] * 3, {"environments": environments})
    assert scores.rewards[:2, 0].tolist() == [1.0, 0.5] and math.isnan(scores.rewards[2, 0])
    assert scores.metrics["rewards/environment/failures"] == 0


def test_an_environment_without_get_reward_stops_the_run(registry):
    with Scorer({"environment": environment_reward(registry)}, workers=0) as scorer:
        with pytest.raises(RewardError, match="has no get_reward"):
            scorer.score(["q"], ["a"], [[1]], {"environments": [object()]})


def test_the_environment_reward_needs_an_environment(registry):
    cfg = grpo_kit.compose(["+reward=environment"], registry)
    with pytest.raises(ConfigError, match=r"\+environment=NAME"):
        registry.build("reward", "environment", options(cfg.reward.environment))
    cfg = grpo_kit.compose(["+reward=environment", "+environment=calculator"], registry)
    assert cfg.reward.environment.environment == "calculator"


def test_environments_reach_every_reward_as_they_are(registry):
    seen = {}

    def in_thread(prompts, completions, completion_ids, environments, **columns):
        seen["environments"] = environments
        return [0.0] * len(completions)

    environments = [Episode(1.0), Episode(0.0)]
    with Scorer({"in_thread": in_thread}, workers=0) as scorer:
        scorer.score(["q"] * 2, ["a"] * 2, [[1]] * 2, {"environments": environments})
    assert seen["environments"] is environments


def test_a_run_scores_with_its_environment(local_plugin, tmp_path):
    from grpo_kit.plugins.registry import Registry, plugin_manager

    registry = Registry(plugin_manager(local_modules=[local_plugin("scored_calculator", SCORED_CALCULATOR)]))
    cfg = grpo_kit.compose(
        [
            "+environment=scored_calculator",
            "+reward=[environment,calls_seen]",
            "trainer.max_steps=2",
        ],
        registry,
    )
    grpo_kit.train(cfg, tmp_path, registry)
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [line for line in metrics if "reward" in line]
    assert steps
    for line in steps:  # the environment's score is whether it was called; calls_seen read the same instances
        called = line["rewards/environment/mean"]
        assert 0.0 <= called <= 1.0 and (called > 0) == (line["rewards/calls_seen/mean"] > 0)
        assert line["rewards/environment/failures"] == 0 and line["rewards/calls_seen/failures"] == 0


CPU_HEAVY = """
    def counts(prompts, completions, completion_ids, **columns):
        assert "environments" not in columns
        return [1.0] * len(completions)

    counts.cpu_heavy = True
"""


def test_environments_stay_out_of_worker_processes(local_plugin):
    """They need not pickle: a reward in a worker process does not get them."""
    import importlib

    counts = importlib.import_module(local_plugin("cpu_heavy_counts", CPU_HEAVY)).counts
    unpicklable = [Episode(lambda: 1.0) for _ in range(2)]
    with Scorer({"counts": counts}, workers=1) as scorer:
        scores = scorer.score(["q"] * 2, ["a"] * 2, [[1]] * 2, {"environments": unpicklable})
    assert scores.rewards[:, 0].tolist() == [1.0, 1.0] and scores.metrics["rewards/counts/failures"] == 0
