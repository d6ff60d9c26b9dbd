"""TRL's extra reward keyword arguments: `trainer_state`, `log_extra` and `log_metric`, as TRL 1.16's
`_calculate_rewards` hands them, in the Scorer and in a run (metrics.jsonl, samples.jsonl)."""

import asyncio
import json
import types
from collections import defaultdict

import pytest
from accelerate import Accelerator
from transformers.trainer_callback import TrainerState

import grpo_kit
from grpo_kit.contract.errors import PluginError, RewardError
from grpo_kit.plugins.registry import Registry, plugin_manager
from grpo_kit.rollout.scoring import Scorer, at_step, reward_trainer_state
from grpo_kit.testing import tiny_run

PROMPTS, COMPLETIONS, IDS = ["1+1=", "1+1=", "2+2="], ["2", "3", "4"], [[1], [2], [3]]
SOLUTIONS = ["2", "2", "4"]


def logging_reward(prompts, completions, completion_ids, **kwargs):
    """Logs a column, and a metric twice, from the step it is told; records what it was handed."""
    logging_reward.seen = dict(kwargs)
    step = kwargs["trainer_state"].global_step
    kwargs["log_extra"]("right", [c == s for c, s in zip(completions, kwargs["solution"])])
    kwargs["log_metric"]("custom/step", step)
    kwargs["log_metric"]("custom/step", step + 1)
    return [float(c == s) for c, s in zip(completions, kwargs["solution"])]


def plain_reward(prompts, completions, completion_ids, solution, **columns):
    """Names no TRL extra: they arrive in **columns, unread."""
    return [float(c == s) for c, s in zip(completions, solution)]


async def async_reward(prompts, completions, completion_ids, trainer_state, log_metric, **columns):
    await asyncio.sleep(0)
    log_metric("custom/async", trainer_state.max_steps)
    return [0.5] * len(completions)


def test_rewards_get_trls_keyword_arguments_and_their_logs_as_trl_collects_them(trl):
    state = TrainerState(global_step=4, max_steps=10)
    trainer = types.SimpleNamespace(
        reward_funcs=[logging_reward],
        reward_func_names=["logging"],
        reward_processing_classes=[None],
        accelerator=Accelerator(cpu=True),
        args=types.SimpleNamespace(report_to=[]),
        state=state,
        environments=None,
        _pending_extra_logs=defaultdict(list),
        _pending_metrics=defaultdict(list),
    )
    trainer._log_completion_extra = types.MethodType(trl.GRPOTrainer._log_completion_extra, trainer)
    trainer._log_metric = types.MethodType(trl.GRPOTrainer._log_metric, trainer)
    rows = [{"prompt": p, "solution": s} for p, s in zip(PROMPTS, SOLUTIONS)]
    theirs = trl.GRPOTrainer._calculate_rewards(trainer, rows, PROMPTS, COMPLETIONS, IDS)
    their_arguments = set(logging_reward.seen)

    with Scorer({"logging": logging_reward, "plain": plain_reward}, trainer_state=state) as scorer:
        ours = scorer.score(PROMPTS, COMPLETIONS, IDS, {"solution": SOLUTIONS})
    assert set(logging_reward.seen) == their_arguments == {"solution", "trainer_state", "log_extra", "log_metric"}
    assert logging_reward.seen["trainer_state"] is state
    assert ours.rewards[:, 0].tolist() == theirs[:, 0].tolist() == ours.rewards[:, 1].tolist()
    assert ours.extra_columns == dict(trainer._pending_extra_logs) == {"right": [True, False, True]}
    metric = trainer._pending_metrics["custom/step"]
    assert ours.metrics["custom/step"] == sum(metric) / len(metric) == 4.5  # TRL's mean of the batch's values


def test_async_rewards_log_too_and_the_state_follows_the_steps():
    state = reward_trainer_state(max_steps=8, epochs=2.0)
    with Scorer({"async": async_reward}, trainer_state=state) as scorer:
        at_step(state, 2)
        metrics = scorer.score(PROMPTS, COMPLETIONS, IDS, {}).metrics
    assert metrics["custom/async"] == 8.0
    assert (state.global_step, state.epoch) == (2, 0.5)


def test_a_column_that_is_not_one_value_per_completion_stops_the_run():
    def twice(prompts, completions, completion_ids, log_extra, **columns):
        log_extra("note", ["x"] * len(completions))
        return [0.0] * len(completions)

    with Scorer({"a": twice, "b": twice}) as scorer, pytest.raises(RewardError, match="6 values in the column 'note'"):
        scorer.score(PROMPTS, COMPLETIONS, IDS, {})


def test_rewards_in_worker_processes_get_the_state_but_cannot_log(local_plugin):
    module = __import__(
        local_plugin(
            "heavy_rewards",
            """
        def step(prompts, completions, completion_ids, trainer_state, **columns):
            return [float(trainer_state.global_step)] * len(completions)
        step.cpu_heavy = True

        def logs(prompts, completions, completion_ids, log_metric, **columns):
            return [0.0] * len(completions)
        logs.cpu_heavy = True
    """,
        )
    )
    state = reward_trainer_state(max_steps=5, epochs=1.0)
    at_step(state, 3)
    with Scorer({"step": module.step}, workers=1, trainer_state=state) as scorer:
        assert scorer.score(PROMPTS, COMPLETIONS, IDS, {}).rewards[:, 0].tolist() == [3.0, 3.0, 3.0]
    with pytest.raises(PluginError, match="takes log_metric, which cannot log from there"):
        Scorer({"logs": module.logs}, workers=1)
    with Scorer({"logs": module.logs}, workers=0) as scorer:  # in a thread it may
        scorer.score(PROMPTS, COMPLETIONS, IDS, {})


def test_a_run_logs_the_rewards_metric_and_column(local_plugin, tiny_model, tmp_path):
    module = local_plugin(
        "stepwise_reward",
        """
        import grpo_kit

        def stepwise(prompts, completions, completion_ids, trainer_state, log_extra, log_metric, **columns):
            log_metric("custom/global_step", trainer_state.global_step)
            log_metric("custom/max_steps", trainer_state.max_steps)
            log_extra("length", [len(text) for text in completions])
            return [len(text) / 10 for text in completions]

        @grpo_kit.hookimpl
        def register_rewards(register):
            register("stepwise", stepwise)
    """,
    )
    registry = Registry(plugin_manager(local_modules=[module]))
    cfg = grpo_kit.compose(tiny_run(tiny_model, "+reward=stepwise", "trainer.sample_every=1"), registry)
    run_dir = grpo_kit.train(cfg, tmp_path / "run", registry)
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [line["custom/global_step"] for line in steps] == [0, 1, 2]  # the steps done when the batch was scored
    assert {line["custom/max_steps"] for line in steps} == {3}
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert samples and all(row["extra"]["length"] == len(row["completion"]) for row in samples)
    assert "<th>length</th>" in (run_dir / "samples.html").read_text()
