"""Synchronous (algorithm.max_staleness=0) against asynchronous (max_staleness=1) generation through the CPU test
server on the embedded default: seconds per step, tokens per second, and the learning curve of each.

    python benchmarks/async_generation.py                 # 500 steps each, one round; ~8 min on 2 cores
    python benchmarks/async_generation.py --steps 100 --rounds 2

The test server runs in its own process with one torch thread and the trainer with one, so that each has a core:
generation then overlaps training, as it does when vLLM has GPUs of its own. Each run is the README's main command
(`+loss=dapo +reward=accuracy generation=vllm_server generation.launch=test`), the two settings taking turns in
each round. Per step: the median of `seconds_per_step` after the first five steps; the run's wall time over its
steps (server start excluded, since `seconds_per_step` sums to it); and `train_tokens_per_second` at the end. The
curve is the mean reward of each tenth of the steps, and `eval/reward` on the held-out sums at the end.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

WARM_UP = 5
SETTINGS = {"K=0": "algorithm.max_staleness=0", "K=1": "algorithm.max_staleness=1"}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run(setting: str, steps: int, folder: Path) -> dict:
    run_dir = folder / f"{setting.replace('=', '')}-{len(list(folder.iterdir()))}"  # no "=" in an override
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpo_kit",
            "+loss=dapo",
            "+reward=accuracy",
            "generation=vllm_server",
            "generation.launch=test",
            f"generation.base_url=http://127.0.0.1:{free_port()}",
            "generation.launch_env={OMP_NUM_THREADS: 1}",
            "trainer.torch_threads=1",
            SETTINGS[setting],
            f"trainer.max_steps={steps}",
            "trainer.save_model=false",
            "trainer.progress_bar=false",
            "trainer.logging_steps=1",
            f"hydra.run.dir={run_dir}",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    trained = [line for line in lines if "seconds_per_step" in line]
    rewards = [line["reward"] for line in trained]
    tenth = max(1, len(rewards) // 10)
    return {
        "median": statistics.median(line["seconds_per_step"] for line in trained if line["step"] > WARM_UP),
        "mean": sum(line["seconds_per_step"] for line in trained) / len(trained),
        "tokens_per_second": trained[-1]["train_tokens_per_second"],
        "curve": [sum(rewards[start : start + tenth]) / tenth for start in range(0, len(rewards), tenth)][:10],
        "eval": [line["eval/reward"] for line in lines if "eval/reward" in line][-1:],
        "staleness": max(line.get("async/staleness/max", 0) for line in trained),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    results = {setting: [] for setting in SETTINGS}
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(args.rounds):
            for setting in SETTINGS:
                result = run(setting, args.steps, Path(folder))
                results[setting].append(result)
                curve = " ".join(f"{value:.2f}" for value in result["curve"])
                print(
                    f"{setting}: median {result['median']:.3f} s/step, mean {result['mean']:.3f} s/step, "
                    f"{result['tokens_per_second']:.0f} tokens/s, max staleness {result['staleness']:.0f}, "
                    f"eval/reward {result['eval']}, reward by tenths: {curve}",
                    flush=True,
                )
    median = {setting: statistics.median(r["median"] for r in runs) for setting, runs in results.items()}
    mean = {setting: statistics.median(r["mean"] for r in runs) for setting, runs in results.items()}
    print(f"\nK=1 / K=0 step time: median {median['K=1'] / median['K=0']:.2f}x, mean {mean['K=1'] / mean['K=0']:.2f}x")


if __name__ == "__main__":
    main()
