"""Asynchronous generation (algorithm.max_staleness) through the CPU test server: the worker, the weight syncs
between its requests, the staleness bound, several processes, a lost server and a resume."""

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpo_kit.testing.models import build_tiny_model
from grpo_kit.testing.runs import tiny_run


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def logged(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def grpo_kit(*overrides: str, **options) -> subprocess.CompletedProcess | subprocess.Popen:
    command = [sys.executable, "-m", "grpo_kit", *overrides]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if options.pop("background", False):
        return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=900, **options)


def server_options() -> list[str]:
    return ["generation=vllm_server", "generation.launch=test", f"generation.base_url=http://127.0.0.1:{free_port()}"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("async-model"))


def test_every_batch_is_at_most_max_staleness_steps_older_than_the_weights_it_trains(model_dir, tmp_path):
    run_dir = tmp_path / "run"
    result = grpo_kit(
        *tiny_run(model_dir, "trainer.max_steps=6"),
        "+reward=accuracy",
        *server_options(),
        "algorithm.max_staleness=2",
        f"hydra.run.dir={run_dir}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = logged(run_dir)
    assert [line["step"] for line in lines] == [1, 2, 3, 4, 5, 6]
    staleness = [line["async/staleness/max"] for line in lines]
    assert staleness[0] == 0 and all(0 <= value <= 2 for value in staleness), staleness
    assert all(line["async/trainer_wait_seconds"] >= 0 and "async/generator_wait_seconds" in line for line in lines)


@pytest.mark.slow
def test_with_max_staleness_1_the_main_command_learns_through_a_launched_test_server(tmp_path):
    run_dir = tmp_path / "run"
    result = grpo_kit(
        "+loss=dapo",
        "+reward=accuracy",
        *server_options(),
        "algorithm.max_staleness=1",
        "trainer.progress_bar=false",
        f"hydra.run.dir={run_dir}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in logged(run_dir) if "reward" in line]
    assert all(line["async/staleness/max"] <= 1 for line in lines)
    assert sum(line["async/staleness/mean"] for line in lines) / len(lines) > 0.9, "it should mostly run ahead"
    rewards = [line["reward"] for line in lines]
    tenth = len(rewards) // 10
    first, last = sum(rewards[:tenth]) / tenth, sum(rewards[-tenth:]) / tenth
    print(f"max_staleness=1: mean reward {first:.3f} in the first tenth of steps, {last:.3f} in the last")
    assert last >= 0.5 and last >= first + 0.3


@pytest.mark.slow
def test_two_processes_each_generate_their_own_share_ahead(model_dir, tmp_path):
    run_dir = tmp_path / "run"
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
    result = subprocess.run(
        [
            *launch,
            "-m",
            "grpo_kit",
            *tiny_run(model_dir, "trainer.max_steps=4"),
            "+reward=accuracy",
            *server_options(),
            "algorithm.max_staleness=1",
            f"hydra.run.dir={run_dir}",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = logged(run_dir)
    assert [line["step"] for line in lines] == [1, 2, 3, 4]
    assert [line["async/staleness/max"] for line in lines] == [0, 1, 1, 1]


@pytest.mark.slow
def test_a_lost_server_stops_the_run_with_a_checkpoint_and_the_resume_drops_what_was_generated_ahead(
    model_dir, tmp_path
):
    run_dir, port = tmp_path / "run", free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "grpo_kit_vllm.testing.server", str(model_dir), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    overrides = [
        *tiny_run(model_dir, "trainer.max_steps=12"),
        "+reward=accuracy",
        "generation=vllm_server",
        f"generation.base_url=http://127.0.0.1:{port}",
        "generation.retries=1",
        "generation.connect_timeout=120",
        "algorithm.max_staleness=1",
        f"hydra.run.dir={run_dir}",
    ]
    trainer = grpo_kit(*overrides, background=True)
    deadline = time.monotonic() + 300
    while not (run_dir / "metrics.jsonl").exists() or len(logged(run_dir)) < 3:
        assert trainer.poll() is None and time.monotonic() < deadline, trainer.stdout.read()[-3000:]
        time.sleep(0.2)
    server.kill()
    server.wait()
    output, _ = trainer.communicate(timeout=300)
    assert trainer.returncode != 0 and "stopped answering" in output, output[-3000:]
    step = int(re.search(r"A checkpoint of step (\d+) is saved", output).group(1))
    command = re.search(r"resume with:\n\s+(python -m grpo_kit .*)", output).group(1)

    server = subprocess.Popen(
        [sys.executable, "-m", "grpo_kit_vllm.testing.server", str(model_dir), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        resumed = subprocess.run(
            shlex.split(command.replace("python", sys.executable, 1)), capture_output=True, text=True, timeout=600
        )
    finally:
        server.kill()
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    log = resumed.stderr + resumed.stdout
    assert re.search(r"\d+ batch\(es\) generated ahead when the checkpoint was saved were not kept", log), log[-3000:]
    assert [line["step"] for line in logged(run_dir)][-1] == 12 and step >= 3
