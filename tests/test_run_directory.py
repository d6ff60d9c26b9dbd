"""A run directory: claimed only when a run may use it, never lost to a run that fails or is refused."""

import json
import logging
import os
import subprocess
import sys

import pytest

import grpo_kit
from grpo_kit.contract.errors import ConfigError, InputFileError, RewardError
from grpo_kit.testing import tiny_run

BROKEN_REWARD = """
    import grpo_kit

    def broken(prompts, completions, completion_ids, **columns):
        return []  # one value per completion is owed: the run stops with RewardError at its first step

    @grpo_kit.hookimpl
    def register_rewards(register):
        register("broken", broken)
"""


@pytest.fixture
def broken_registry(local_plugin):
    from grpo_kit.plugins.registry import Registry, plugin_manager

    return Registry(plugin_manager(local_modules=[local_plugin("broken_reward", BROKEN_REWARD)]))


def trained_steps(run_dir):
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_run_that_failed_before_its_first_step_leaves_its_directory_usable(broken_registry, tiny_model, tmp_path):
    with pytest.raises(RewardError):
        grpo_kit.train(
            grpo_kit.compose(tiny_run(tiny_model, "+reward=broken"), broken_registry), tmp_path, broken_registry
        )
    assert (tmp_path / "metrics.jsonl").read_text() == ""

    grpo_kit.train(
        grpo_kit.compose(tiny_run(tiny_model, "+reward=accuracy"), broken_registry), tmp_path, broken_registry
    )
    assert trained_steps(tmp_path) == [1, 2, 3]


def test_resume_auto_without_a_checkpoint_starts_from_step_0_and_says_so(registry, tiny_model, tmp_path, caplog):
    cfg = grpo_kit.compose(
        tiny_run(tiny_model, "+reward=accuracy", "trainer.resume=auto", "trainer.max_steps=1"), registry
    )
    with caplog.at_level(logging.INFO, logger="grpo_kit"):
        grpo_kit.train(cfg, tmp_path, registry)
    assert f"No checkpoint in {tmp_path}: starting from step 0" in caplog.text
    assert trained_steps(tmp_path) == [1]


def test_a_trained_run_without_a_checkpoint_is_not_resumed_over(registry, tiny_model, tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "eval/reward": 0.2}\n{"step": 1, "reward": 0.3}\n')
    cfg = grpo_kit.compose(tiny_run(tiny_model, "+reward=accuracy", "trainer.resume=auto"), registry)
    with pytest.raises(ConfigError, match="trained 1 step.* but no checkpoint to resume from"):
        grpo_kit.train(cfg, tmp_path, registry)


def test_max_steps_minus_one_trains_num_train_epochs(registry, tiny_model, tmp_path):
    # 64 prompts, 2 per generation batch of 8 completions (4 each), one generation batch per step: 32 steps an epoch.
    cfg = grpo_kit.compose(
        tiny_run(tiny_model, "+reward=accuracy", "trainer.max_steps=-1", "trainer.num_train_epochs=0.1"), registry
    )
    grpo_kit.train(cfg, tmp_path, registry)
    assert trained_steps(tmp_path) == [1, 2, 3, 4]  # ceil(0.1 x 32)


@pytest.mark.parametrize("schedule, refused", [("linear", True), ("constant", False)])
def test_a_longer_resumed_run_is_refused_when_its_schedule_depends_on_the_length(
    registry, tiny_model, tmp_path, schedule, refused
):
    base = tiny_run(tiny_model, "+reward=accuracy", "trainer.max_steps=2", f"trainer.lr_scheduler_type={schedule}")
    grpo_kit.train(grpo_kit.compose(base, registry), tmp_path, registry)
    longer = grpo_kit.compose([*base, "trainer.max_steps=3", "trainer.resume=auto"], registry)
    if refused:
        with pytest.raises(ConfigError, match=r"trainer.max_steps: 2 -> 3 \(the linear learning-rate schedule"):
            grpo_kit.train(longer, tmp_path, registry)
        assert trained_steps(tmp_path) == [1, 2]
    else:
        grpo_kit.train(longer, tmp_path, registry)
        assert trained_steps(tmp_path) == [1, 2, 3]


def cli(run_dir, tiny_model, env, *overrides):
    command = [
        sys.executable,
        "-m",
        "grpo_kit",
        *tiny_run(tiny_model, "trainer.max_steps=1", *overrides),
        f"hydra.run.dir={run_dir}",
    ]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


def snapshot(directory):
    return {path: path.read_bytes() for path in sorted(directory.rglob("*")) if path.is_file()}


@pytest.mark.slow
def test_from_the_command_line_a_failed_run_is_recorded_a_retry_trains_and_a_refused_run_changes_nothing(
    tiny_model, tmp_path
):
    (tmp_path / "broken_reward.py").write_text(BROKEN_REWARD.replace("\n    ", "\n"))
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "GRPO_KIT_PLUGINS": "broken_reward", "OMP_NUM_THREADS": "1"}
    run_dir = tmp_path / "run"

    failed = cli(run_dir, tiny_model, env, "+reward=broken")
    assert failed.returncode == 1
    assert "Traceback" not in failed.stdout + failed.stderr  # a known error is its message alone
    assert "RewardError" in (run_dir / "error.txt").read_text()
    assert "Traceback" in (run_dir / "cli.log").read_text()

    retried = cli(run_dir, tiny_model, env, "+reward=accuracy")
    assert retried.returncode == 0, retried.stdout + retried.stderr
    assert not (run_dir / "error.txt").exists()
    log = (run_dir / "cli.log").read_text()
    assert f"Run directory: {run_dir}" in log and f"Done: {run_dir}, final reward" in log
    assert f"Done: {run_dir}, final reward" in retried.stdout
    assert "+reward=accuracy" in (run_dir / ".hydra" / "overrides.yaml").read_text()

    before = snapshot(run_dir)
    refused = cli(run_dir, tiny_model, env, "+reward=accuracy", "loss.epsilon=0.3")
    assert refused.returncode == 1
    assert "already holds a run that trained 1 step" in refused.stdout + refused.stderr
    assert snapshot(run_dir) == before


FAILING_START = """
    import grpo_kit

    class FailsAtStart:
        def __init__(self, config):
            pass

        @grpo_kit.hookimpl
        def on_train_start(self, run):
            raise RuntimeError("the real error")

    @grpo_kit.hookimpl
    def register_hooks(register):
        register("fails_at_start", FailsAtStart)
"""


def test_a_run_that_fails_early_reports_its_own_error_and_leaves_the_next_run_clean(local_plugin, tiny_model, tmp_path):
    from grpo_kit.plugins.registry import Registry, plugin_manager

    registry = Registry(plugin_manager(local_modules=[local_plugin("fails_at_start", FAILING_START)]))
    with pytest.raises(RuntimeError, match="the real error"):
        grpo_kit.train(
            grpo_kit.compose(tiny_run(tiny_model, "+reward=accuracy", "+hook=fails_at_start"), registry),
            tmp_path / "failed",
            registry,
        )
    grpo_kit.train(grpo_kit.compose(tiny_run(tiny_model, "+reward=accuracy"), registry), tmp_path / "next", registry)
    assert trained_steps(tmp_path / "next") == [1, 2, 3]  # one line a step: no logger of the failed run is left


@pytest.mark.slow
def test_in_a_sweep_a_run_that_fails_early_records_its_error_and_the_next_one_trains(tiny_model, tmp_path):
    sweep = tmp_path / "sweep"
    command = [
        sys.executable,
        "-m",
        "grpo_kit",
        "-m",
        *tiny_run(tiny_model, "+reward=accuracy", "trainer.max_steps=2"),
        "generation.temperature=0,1.0",
        f"hydra.sweep.dir={sweep}",
        "~hydra.callbacks.report",
    ]
    done = subprocess.run(
        command, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 1, done.stdout + done.stderr  # once the next run is done
    assert "generation.temperature=0.0" in (sweep / "0" / "error.txt").read_text()
    assert "UnboundLocalError" not in done.stdout + done.stderr
    assert trained_steps(sweep / "1") == [1, 2]


@pytest.mark.parametrize(
    "link",
    [
        ".lock",
        "metrics.jsonl",
        "config.yaml",
        ".hydra/overrides.yaml",
        "checkpoints/step-1",
        "checkpoints/step-1/model",
    ],
)
def test_a_link_where_the_run_writes_is_refused_and_its_target_left_alone(registry, tiny_model, tmp_path, link):
    """Each was followed: a .lock link truncated the user's file, a metrics.jsonl link overwrote its target, and a
    linked checkpoint broke rotation before model/ was written."""
    target = tmp_path / "precious.txt"
    target.write_text("the user's own file\n")
    run_dir = tmp_path / "run"
    (run_dir / link).parent.mkdir(parents=True, exist_ok=True)
    (run_dir / link).symlink_to(target)
    cfg = grpo_kit.compose(tiny_run(tiny_model, "+reward=accuracy", "trainer.max_steps=1"), registry)
    with pytest.raises(InputFileError, match=rf"{link.split('/')[-1]} is a symbolic link \(to {target}\)"):
        grpo_kit.train(cfg, run_dir, registry)
    assert target.read_text() == "the user's own file\n"
    assert sorted(path.name for path in run_dir.iterdir()) == sorted({link.split("/")[0]}), "nothing was written"


def test_the_run_directory_itself_may_be_a_link(registry, tiny_model, tmp_path):
    (tmp_path / "scratch").mkdir()
    (tmp_path / "run").symlink_to(tmp_path / "scratch")
    cfg = grpo_kit.compose(tiny_run(tiny_model, "+reward=accuracy", "trainer.max_steps=1"), registry)
    grpo_kit.train(cfg, tmp_path / "run", registry)
    assert (tmp_path / "scratch" / "metrics.jsonl").is_file()
