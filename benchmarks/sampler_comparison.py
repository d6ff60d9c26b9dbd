"""Two samplers compared over paired seeds, from a sweep's run directories (docs/plugins/sampler.md): per run, the
mean share of flat groups (frac_reward_zero_std), reward per generated token and the held-out reward at each
evaluation; per sampler their mean over seeds, and the second sampler's paired difference from `uniform`.

    python benchmarks/sampler_comparison.py multirun/DATE/TIME
"""

import argparse
import json
import statistics
from pathlib import Path

import yaml


def override(overrides: list[str], key: str) -> str:
    return next(line.split("=", 1)[1] for line in overrides if line.lstrip("+").startswith(f"{key}="))


def measured(run: Path) -> dict[str, float]:
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [line for line in lines if line["step"] > 0 and "reward" in line]
    per_run = {
        "flat groups": statistics.mean(line["frac_reward_zero_std"] for line in steps),
        "reward per token": sum(line["reward"] for line in steps)
        / sum(line["completions/mean_length"] for line in steps),
    }
    evaluated = {
        f"held-out reward, step {line['step']}": line["eval/reward"] for line in lines if "eval/reward" in line
    }
    return per_run | evaluated


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep", type=Path)
    args = parser.parse_args()
    runs = {}
    for run in sorted(path for path in args.sweep.iterdir() if (path / "metrics.jsonl").exists()):
        overrides = yaml.safe_load((run / ".hydra" / "overrides.yaml").read_text())
        runs[override(overrides, "sampler"), int(override(overrides, "seed"))] = measured(run)
    other = next(sampler for sampler, _ in runs if sampler != "uniform")
    seeds = sorted(seed for sampler, seed in runs if sampler == "uniform" and (other, seed) in runs)
    print(f"{'':34} {'uniform':>8} {other:>16}  paired difference (per seed {seeds})")
    for metric in runs["uniform", seeds[0]]:
        base = [runs["uniform", seed][metric] for seed in seeds]
        compared = [runs[other, seed][metric] for seed in seeds]
        differences = ", ".join(f"{b - a:+.3f}" for a, b in zip(base, compared))
        mean_difference = statistics.mean(compared) - statistics.mean(base)
        print(
            f"{metric:34} {statistics.mean(base):>8.3f} {statistics.mean(compared):>16.3f}  "
            f"{mean_difference:+.3f} ({differences})"
        )


if __name__ == "__main__":
    main()
