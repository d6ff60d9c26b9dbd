"""Reference bands: what a paper recipe's short run on an embedded task logs, over several seeds, and whether a
run stays inside.

A band file (tests/recipe_bands/NAME.json, written by tests/recipe_bands/regenerate.py) holds the recipe's
command, the seeds it ran, and for each metric of BAND_METRICS its mean and standard deviation over those seeds at
fixed steps. The value of a metric "at step S" is its mean over the logged training steps in (S - window, S]: a
single step's reward of 128 completions is too noisy to pin, a window's mean is not. A run is inside the band when
every such value lies within mean ± k x max(std, std_floor); the floor keeps a metric that happened to agree
across the few seeds from giving a band narrower than another machine's rounding.
"""

import json
import math
from dataclasses import dataclass
from pathlib import Path

from grpo_kit.contract.errors import ReportError
from grpo_kit.report.collect import Run

BAND_METRICS = ("reward", "completions/mean_length", "entropy")


def window_means(metrics: list[dict], steps: list[int], window: int) -> dict[str, list[float]]:
    """Each metric's mean over the logged training steps in (S - window, S], for each S of `steps`; NaN where
    the run logged none of them (it stopped earlier)."""
    training = [line for line in metrics if "loss" in line]  # a step-0 evaluation line has no loss
    means = {}
    for metric in BAND_METRICS:
        means[metric] = []
        for step in steps:
            values = [line[metric] for line in training if step - window < line["step"] <= step]
            values = [value for value in values if value is not None]
            means[metric].append(sum(values) / len(values) if values else math.nan)
    return means


@dataclass(frozen=True)
class Band:
    recipe: str
    command: list[str]  # the overrides of `python -m grpo_kit`, less the seed
    steps: list[int]
    window: int
    k: float
    seeds: list[int]  # the seeds the band is made of
    test_seed: int  # the seed the slow test runs: not one of `seeds`, so the band is tested on a new draw
    mean: dict[str, list[float]]
    std: dict[str, list[float]]
    std_floor: dict[str, float]
    per_seed: dict[str, dict[str, list[float]]]  # seed -> window_means: what mean and std were computed from

    @classmethod
    def read(cls, path: Path) -> "Band":
        try:
            data = json.loads(Path(path).read_text())
            return cls(**{name: data[name] for name in cls.__dataclass_fields__})
        except FileNotFoundError:
            raise ReportError(f"No band file {path}: the recipes' bands are in tests/recipe_bands/NAME.json.") from None
        except (KeyError, TypeError, json.JSONDecodeError) as error:
            raise ReportError(
                f"{path} is not a band file ({error!r}): write one with python tests/recipe_bands/regenerate.py."
            ) from None

    def bounds(self, metric: str) -> tuple[list[float], list[float]]:
        half = [self.k * max(std, self.std_floor[metric]) for std in self.std[metric]]
        return [m - h for m, h in zip(self.mean[metric], half)], [m + h for m, h in zip(self.mean[metric], half)]

    def outside(self, values: dict[str, list[float]]) -> list[str]:
        """A sentence for each of a run's values (window_means at this band's steps) outside the band."""
        found = []
        for metric in BAND_METRICS:
            low, high = self.bounds(metric)
            for step, value, lo, hi in zip(self.steps, values[metric], low, high):
                if not lo <= value <= hi:  # NaN (a run that stopped early) is outside too
                    found.append(f"{metric} at step {step}: {value:.4f} outside [{lo:.4f}, {hi:.4f}]")
        return found

    def values_of(self, run: Run) -> dict[str, list[float]]:
        return window_means(run.metrics, self.steps, self.window)


def band_record(
    recipe: str,
    command: list[str],
    steps: list[int],
    window: int,
    k: float,
    seeds: list[int],
    test_seed: int,
    per_seed: dict[int, dict[str, list[float]]],
    std_floor: dict[str, float],
    provenance: dict,
) -> dict:
    """A band file's content: the mean and sample std over `per_seed` (seed -> window_means), and how it was made."""
    mean, std = {}, {}
    for metric in BAND_METRICS:
        columns = list(zip(*(per_seed[seed][metric] for seed in seeds)))
        mean[metric] = [sum(column) / len(column) for column in columns]
        std[metric] = [_sample_std(column) for column in columns]
    return {
        "recipe": recipe, "command": command, "steps": steps, "window": window, "k": k, "seeds": seeds,
        "test_seed": test_seed, "mean": mean, "std": std, "std_floor": std_floor,
        "per_seed": {str(seed): values for seed, values in per_seed.items()}, "recorded_with": provenance,
    }  # fmt: skip


def band_section(runs: list[Run], band: Band, path: Path) -> list[str]:
    """report.md's lines: each run's values at the band's steps, and what lies outside."""
    lines = [
        "",
        f"## Against the reference band of `{band.recipe}`",
        "",
        f"{path}: mean ± {band.k:g} std over seeds {band.seeds} of `python -m grpo_kit {' '.join(band.command)}`, "
        f"each value the mean over the {band.window} logged steps up to the step named.",
        "",
        "| run | " + " | ".join(f"{metric} @ {step}" for metric in BAND_METRICS for step in band.steps) + " | inside |",
        "|---" * (1 + len(BAND_METRICS) * len(band.steps) + 1) + "|",
    ]
    bound = {metric: band.bounds(metric) for metric in BAND_METRICS}
    band_cells = [f"{lo:.3f} to {hi:.3f}" for metric in BAND_METRICS for lo, hi in zip(*bound[metric])]
    lines.append("| band | " + " | ".join(band_cells) + " | |")
    outside_of = {}
    for run in runs:
        values = band.values_of(run)
        cells = [f"{value:.3f}" for metric in BAND_METRICS for value in values[metric]]
        outside_of[run_label(run)] = band.outside(values)
        lines.append(
            f"| {run_label(run)} | " + " | ".join(cells) + f" | {'no' if outside_of[run_label(run)] else 'yes'} |"
        )
    for label, outside in outside_of.items():
        lines += [""] + [f"- run {label}: {sentence}" for sentence in outside] if outside else []
    return lines


def run_label(run: Run) -> str:
    """The run's folder in its sweep, or the run directory's own name for a report of one run ("." says nothing)."""
    return run.directory.name if run.name == "." else run.name


def _sample_std(values) -> float:
    if len(values) < 2:
        return math.nan
    mean = sum(values) / len(values)
    return math.sqrt(sum((value - mean) ** 2 for value in values) / (len(values) - 1))
