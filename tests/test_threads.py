"""Runs that share a machine share its cores: torch's thread count (grpo_kit/model/threads.py) and that a run uses
it."""

import os
import sys
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch

import grpo_kit
from grpo_kit.cli import main as cli
from grpo_kit.contract.errors import ConfigError
from grpo_kit.model.threads import chosen_threads, concurrent_runs
from grpo_kit.plugins.registry import Registry, plugin_manager
from grpo_kit.testing.runs import tiny_run

JOBLIB = "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher"


def test_the_option_wins_then_omp_num_threads_then_one_for_a_small_model_then_a_share_of_the_cores():
    assert chosen_threads(3, "2", cores=8, runs=2, width=128) == 3
    assert chosen_threads(None, "2", cores=8, runs=1, width=128) == 2  # the user's, or a launcher's (loky, torchrun)
    assert chosen_threads(None, None, cores=8, runs=1, width=128) == 1  # the embedded default: nothing to split
    assert chosen_threads(None, None, cores=8, runs=1, width=896) == 8  # Qwen2.5-0.5B
    assert chosen_threads(None, None, cores=8, runs=3, width=896) == 2
    assert chosen_threads(None, None, cores=2, runs=4, width=896) == 1


def test_no_threads_is_refused():
    with pytest.raises(ConfigError, match="trainer.torch_threads=0 must be 1 or more"):
        chosen_threads(0, None, cores=2, runs=1, width=896)


def test_a_joblib_sweep_runs_n_jobs_at_once_and_other_launchers_one():
    assert concurrent_runs(None) == 1  # a run from Python
    assert concurrent_runs({"_target_": "hydra._internal.core_plugins.basic_launcher.BasicLauncher"}) == 1
    assert concurrent_runs({"_target_": JOBLIB, "n_jobs": 4}) == 4
    assert concurrent_runs({"_target_": JOBLIB, "n_jobs": -1}) >= 1  # joblib's "every core"


@dataclass
class ThreadsSeenConfig:
    pass


class ThreadsSeen:
    seen: ClassVar[list[int]] = []

    def __init__(self, config):
        pass

    @grpo_kit.hookimpl
    def on_step_end(self, run, step, metrics):
        self.seen.append(torch.get_num_threads())


class ThreadsSeenPlugin:
    @grpo_kit.hookimpl
    def register_hooks(self, register):
        register("threads_seen", ThreadsSeen, ThreadsSeenConfig)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_run_computes_with_the_threads_it_is_given(tiny_model, tmp_path, threads):
    pm = plugin_manager()
    pm.register(ThreadsSeenPlugin())
    registry = Registry(pm)
    before = torch.get_num_threads()
    ThreadsSeen.seen.clear()
    cfg = grpo_kit.compose(
        tiny_run(
            tiny_model,
            "trainer.max_steps=1",
            f"trainer.torch_threads={threads}",
            "+reward=accuracy",
            "+hook=threads_seen",
        ),
        registry=registry,
    )
    try:
        grpo_kit.train(cfg, tmp_path / "run", registry)
    finally:
        torch.set_num_threads(before)  # the other tests in this process keep theirs
    assert ThreadsSeen.seen == [threads]


@pytest.mark.parametrize(("users", "seen"), [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_the_command_line_makes_idle_threads_sleep_unless_the_user_chose(monkeypatch, capsys, users, seen):
    environment = {} if users is None else {"OMP_WAIT_POLICY": users}
    monkeypatch.setattr(os, "environ", environment)  # what a sweep's workers and torch, imported later, will read
    monkeypatch.setattr(sys, "argv", ["grpo_kit", "--help"])
    cli.main()
    assert environment["OMP_WAIT_POLICY"] == seen
