"""Seconds per step of the default run alone, and of two default runs at once on the same machine.

    python benchmarks/concurrent_runs.py                                  # ~1 min on 2 quiet cores
    python benchmarks/concurrent_runs.py --steps 60
    python benchmarks/concurrent_runs.py --env OMP_WAIT_POLICY=ACTIVE     # spinning threads, as before the fix

Each run is `python -m grpo_kit +reward=accuracy trainer.max_steps=STEPS` in a fresh process; its figure is the
median of the `seconds_per_step` it logs, so that imports and the model's loading do not count. Two runs at once
share the cores: each should take about its share of them (grpo_kit/model/threads.py), so a step should take at most
2.5 times as long as alone, where spinning OpenMP threads made it take 10 to 100 times as long. The last line
says PASS or FAIL. Measure on an otherwise quiet machine: any other work on the cores changes both figures.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

LIMIT = 2.5  # two runs at once on the cores of one: each step at most this many times as long as alone


def start(run_dir: Path, steps: int, env: dict[str, str]) -> subprocess.Popen:
    command = [
        sys.executable,
        "-m",
        "grpo_kit",
        "+reward=accuracy",
        f"trainer.max_steps={steps}",
        "trainer.progress_bar=false",
        f"hydra.run.dir={run_dir}",
    ]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)


def seconds_per_step(run_dir: Path) -> float:
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return statistics.median(line["seconds_per_step"] for line in lines if "seconds_per_step" in line)


def timed(run_dirs: list[Path], steps: int, env: dict[str, str]) -> list[float]:
    """The runs started together; each one's median seconds per step."""
    processes = [start(run_dir, steps, env) for run_dir in run_dirs]
    for process in processes:
        if process.wait() != 0:
            sys.exit(f"a run failed: {process.args}")
    return [seconds_per_step(run_dir) for run_dir in run_dirs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="set in every run")
    args = parser.parse_args()
    env = dict(os.environ, **dict(pair.split("=", 1) for pair in args.env))
    with tempfile.TemporaryDirectory(prefix="grpo_kit-concurrent-") as folder:
        timed([Path(folder, "warm-up")], 2, env)  # builds the embedded model once, outside the timings
        (alone,) = timed([Path(folder, "alone")], args.steps, env)
        together = timed([Path(folder, "first"), Path(folder, "second")], args.steps, env)
    ratio = statistics.mean(together) / alone
    print(f"one run alone:   {alone:.3f} s/step")
    print(f"two runs at once: {' and '.join(f'{s:.3f}' for s in together)} s/step")
    print(f"ratio: {ratio:.2f} (at most {LIMIT}): {'PASS' if ratio <= LIMIT else 'FAIL'}")


if __name__ == "__main__":
    main()
