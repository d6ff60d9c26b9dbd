"""What the instruments (docs/instruments.md) cost on the embedded default: seconds per step of each setting
against the plain run, the settings taking turns in each round.

    python benchmarks/instruments.py                  # 60 steps each, 3 rounds; ~6 min on 2 cores
    python benchmarks/instruments.py --steps 30 --rounds 1

Each run is the README's main command (`+loss=dapo +reward=accuracy`) in its own process, with eval and the saved
model off. Per run: the median of `seconds_per_step` after the first five steps. A setting's ratio is the median
over rounds of its run's median against the plain run's of the same round.
- shadow losses: `+shadow=[cispo,grpo]` with `shadow.gradient_every=0`, the values alone (the issue's bound: +10%);
- shadow gradients: every step (`shadow.gradient_every=1`), one extra backward pass per shadow;
- noise scale: `+diagnostics=gradient diagnostics.groups_every=0` (a step of one micro-batch splits it in halves:
  one extra backward pass, and a sketch per micro-step);
- group split: every step (`diagnostics.groups_every=1`), nine extra backward passes.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

WARM_UP = 5
SETTINGS = {
    "plain": [],
    "shadow losses": ["+shadow=[cispo,grpo]", "shadow.gradient_every=0"],
    "shadow gradients, every step": ["+shadow=[cispo,grpo]", "shadow.gradient_every=1"],
    "noise scale": ["+diagnostics=gradient", "diagnostics.groups_every=0"],
    "group split, every step": ["+diagnostics=gradient", "diagnostics.groups_every=1"],
}


def seconds_per_step(overrides: list[str], steps: int, run_dir: Path) -> float:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpo_kit",
            "+loss=dapo",
            "+reward=accuracy",
            *overrides,
            f"trainer.max_steps={steps}",
            "trainer.save_model=false",
            "trainer.progress_bar=false",
            "trainer.logging_steps=1",
            "eval.on_start=false",
            f"hydra.run.dir={run_dir}",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return statistics.median(line["seconds_per_step"] for line in lines if line["step"] > WARM_UP)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    measured = {name: [] for name in SETTINGS}
    with tempfile.TemporaryDirectory() as folder:
        for round_ in range(args.rounds):
            for index, (name, overrides) in enumerate(SETTINGS.items()):
                run_dir = Path(folder) / f"{round_}-{index}"
                measured[name].append(seconds_per_step(overrides, args.steps, run_dir))
    print(f"embedded default, {args.steps} steps, {args.rounds} round(s); median seconds per step after {WARM_UP}")
    print(f"{'setting':<32} {'s/step':>8} {'x plain':>8}")
    for name, seconds in measured.items():
        ratio = statistics.median(own / plain for own, plain in zip(seconds, measured["plain"]))
        print(f"{name:<32} {statistics.median(seconds):>8.4f} {ratio:>8.2f}")


if __name__ == "__main__":
    main()
