"""Tool-calling rollouts through the server backend: every turn is a request of token ids to the CPU test server."""

import json
import socket
import subprocess
import sys

import pytest


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.slow
def test_the_calculator_runs_through_a_server_with_the_samplers_log_probs_aligned_to_the_model_tokens(tmp_path):
    """Tool results are inserted between the server's turns; if a sampler log-prob landed on the wrong token, the
    rollout correction's ratio would be far from 1 on this on-policy run."""
    run_dir = tmp_path / "run"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpo_kit",
            "+reward=accuracy",
            "+environment=calculator",
            "generation=vllm_server",
            "generation.launch=test",
            f"generation.base_url=http://127.0.0.1:{free_port()}",
            "rollout_correction=sequence_mask",
            "trainer.max_steps=3",
            "trainer.progress_bar=false",
            f"hydra.run.dir={run_dir}",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [step for step in steps if "tools/call_frequency" in step]
    assert len(steps) == 3
    assert all(step["tools/call_frequency"] > 0 for step in steps)
    assert all(step["sampling/sampling_logp_difference/max"] < 1e-3 for step in steps)
    for bound in ("min", "max"):
        assert all(abs(step[f"sampling/importance_sampling_ratio/{bound}"] - 1) < 1e-3 for step in steps)
