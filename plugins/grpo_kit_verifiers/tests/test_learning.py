"""The embedded model learns from verifiers episodes: the documented command, end to end (docs/plugins/verifiers.md
records the numbers)."""

import json
import subprocess
import sys
import time

import pytest


@pytest.mark.slow
def test_the_embedded_model_learns_the_verifiers_sums_taskset(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    subprocess.run([sys.executable, "-m", "grpo_kit_verifiers.tasks", "grpo-kit-vf-sums", tasks], check=True)
    start = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpo_kit",
            "+loss=dapo",
            "+rollout=verifiers",
            "+reward=verifiers",
            f"data.path={tasks}",
            "generation.max_completion_length=4",
            "rollout.harness=''",  # the taskset's own one-request harness
            "trainer.max_steps=40",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    seconds = time.perf_counter() - start
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    rewards = [line["reward"] for line in lines if "reward" in line]
    first, last = sum(rewards[:8]) / 8, sum(rewards[-8:]) / 8
    print(f"{seconds:.0f} s; reward {first:.3f} (first 8 steps) -> {last:.3f} (last 8 of {len(rewards)})")
    assert last >= first + 0.08
