"""The README's main command with an LLM judge as its only reward, generating through the CPU vLLM test server: the
judge (conftest.py, a real HTTP server) answers the accuracy of each sum, and the run must learn the embedded task as
the accuracy-rewarded runs do."""

import json
import socket
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_a_judged_run_learns_the_embedded_task_through_the_test_server(tmp_path, judge):
    run_dir = tmp_path / "run"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        generation_port = probe.getsockname()[1]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpo_kit",
            "+loss=dapo",
            "+reward=judge",
            f"reward.judge.base_url={judge.url}",
            "reward.judge.model=judge",
            "reward.judge.template='{prompt}{completion}'",
            "reward.judge.score_max=1",
            "reward.judge.on_failure=stop",  # a judge failure must not pass for a wrong answer
            "generation=vllm_server",
            "generation.launch=test",
            f"generation.base_url=http://127.0.0.1:{generation_port}",
            f"hydra.run.dir={run_dir}",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    held_out = [line["eval/reward"] for line in lines if "eval/reward" in line]
    rewards = [line["reward"] for line in lines if "reward" in line]
    tenth = max(1, len(rewards) // 10)
    first, last = sum(rewards[:tenth]) / tenth, sum(rewards[-tenth:]) / tenth
    print(f"judged: mean reward {first:.3f} in the first tenth of steps, {last:.3f} in the last; held out {held_out}")
    assert judge.requests > 0 and all(line.get("rewards/judge/failed_rows", 0) == 0 for line in lines)
    # tests/test_end_to_end.py's criterion: the last two held-out evaluations well above the untrained policy's
    assert sum(held_out[-2:]) / 2 >= held_out[0] + 0.1
