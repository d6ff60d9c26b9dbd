"""The trackers through accelerate: a real tensorboard run written by the hooks and read back, and the errors."""

import json
import math
import os
import re
import subprocess
import sys

import pytest
from accelerate import Accelerator
from omegaconf import OmegaConf

import grpo_kit
from grpo_kit.contract.errors import ConfigError
from grpo_kit.contract.pipeline import Run
from grpo_kit.outputs import trackers
from grpo_kit.outputs.trackers import TrackerLogger, check_trackers, flat_config

CONFIG = {
    "seed": 3,
    "trainer": {
        "learning_rate": 1e-3,
        "max_steps": 2,
        "report_to": ["tensorboard"],
        "project": "grpo_kit",
        "run_name": None,
    },
    "rollouts": {"replay": None},
    "hook": {},
}
LOGGED = [  # what the trainer's on_log hands the loggers, a NaN included
    {"step": 1, "reward": 0.25, "loss": 0.5, "kl": math.nan},
    {"step": 2, "reward": 0.75, "loss": 0.125, "kl": 0.01},
]


def test_tensorboard_receives_the_logged_metrics(tmp_path, fresh_accelerate_state):
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    accelerator = Accelerator(cpu=True, log_with=check_trackers(["tensorboard"]), project_dir=tmp_path)
    run = Run(OmegaConf.create(CONFIG), tmp_path, accelerator, model=None, tokenizer=None, max_steps=2)
    logger = TrackerLogger()
    logger.on_train_start(run=run)
    for metrics in LOGGED:
        logger.on_log(run=run, step=metrics["step"], metrics=metrics)
    logger.on_train_end(run=run)

    events = event_accumulator.EventAccumulator(str(tmp_path / "grpo_kit"))  # the run's events, not the hparams'
    events.Reload()
    scalars = {tag: [(event.step, event.value) for event in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    assert scalars == {
        "reward": [(1, 0.25), (2, 0.75)],
        "loss": [(1, 0.5), (2, 0.125)],
        "kl": [(2, pytest.approx(0.01))],  # step 1's NaN is no point
    }


def test_config_is_flat_scalars_for_tensorboards_hparams():
    assert flat_config(CONFIG) == {
        "seed": 3,
        "trainer/learning_rate": 1e-3,
        "trainer/max_steps": 2,
        "trainer/report_to": "['tensorboard']",
        "trainer/project": "grpo_kit",
        "trainer/run_name": "None",
        "rollouts/replay": "None",
    }


def test_unknown_tracker_names_the_supported_ones():
    supported = "the supported ones are tensorboard, wandb, trackio"
    with pytest.raises(ConfigError, match=f"unknown tracker 'tensorbord'; {supported}"):
        check_trackers(["tensorbord"])


@pytest.mark.parametrize("name", ["wandb", "trackio"])
def test_a_tracker_not_installed_says_what_to_install(name, monkeypatch):
    monkeypatch.setitem(trackers.SUPPORTED, name, lambda: False)  # as if not installed
    with pytest.raises(ConfigError, match=f"pip install {name}"):
        check_trackers([name])


def test_wandb_is_left_to_its_own_settings(monkeypatch):
    """No silent offline: a logged-in user's runs reach their dashboard, as under TRL."""
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    check_trackers(["wandb"])
    assert "WANDB_MODE" not in os.environ


def test_no_trackers_and_repeats():
    pytest.importorskip("tensorboard")
    assert check_trackers([]) == []
    assert check_trackers(["tensorboard", "tensorboard"]) == ["tensorboard"]


def tracked_run(tiny_model, *trackers):
    return [
        "+reward=accuracy",
        f"model.name_or_path={tiny_model}",
        "data.num_examples=16",
        "generation.num_generations=4",
        "trainer.per_device_train_batch_size=8",
        "trainer.max_steps=2",
        "trainer.progress_bar=false",
        f"trainer.report_to=[{','.join(trackers)}]",
    ]


def test_a_run_reports_to_tensorboard_inside_its_directory(registry, tiny_model, tmp_path):
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    grpo_kit.train(grpo_kit.compose(tracked_run(tiny_model, "tensorboard"), registry), tmp_path / "run", registry)
    events = event_accumulator.EventAccumulator(str(tmp_path / "run" / "trackers" / "grpo_kit"))
    events.Reload()
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [(event.step, event.value) for event in events.Scalars("reward")] == [
        (line["step"], pytest.approx(line["reward"])) for line in logged if "reward" in line
    ]


def test_a_run_reports_to_wandb_offline_inside_its_directory(registry, tiny_model, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    grpo_kit.train(grpo_kit.compose(tracked_run(tiny_model, "wandb"), registry), tmp_path / "run", registry)
    [offline_run] = (tmp_path / "run" / "wandb").glob("offline-run-*")
    [records] = offline_run.glob("*.wandb")
    assert records.stat().st_size > 0


def test_a_run_wandb_cannot_start_stops_with_the_remedy(tiny_model, tmp_path):
    """Not logged in, and no WANDB_MODE: wandb refuses, and the run says how to log in or go offline. In a process
    of its own: a wandb that tried to start leaves state behind that other tests' forks trip on."""
    pytest.importorskip("wandb")
    environment = {name: value for name, value in os.environ.items() if not name.startswith("WANDB_")}
    environment |= {"HOME": str(tmp_path / "home"), "WANDB_CONFIG_DIR": str(tmp_path / "home" / "wandb")}
    command = [sys.executable, "-m", "grpo_kit", *tracked_run(tiny_model, "wandb"), f"hydra.run.dir={tmp_path / 'run'}"]
    finished = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=300)
    assert finished.returncode != 0
    assert re.search(r"wandb login.*WANDB_MODE=offline", finished.stdout + finished.stderr), finished.stderr[-2000:]


def test_a_missing_tracker_stops_the_run_before_it_starts(registry, tiny_model, tmp_path, monkeypatch):
    monkeypatch.setitem(trackers.SUPPORTED, "trackio", lambda: False)  # as if not installed
    with pytest.raises(ConfigError, match="pip install trackio"):
        grpo_kit.train(grpo_kit.compose(tracked_run(tiny_model, "trackio"), registry), tmp_path / "run", registry)
    assert not (tmp_path / "run").exists()
