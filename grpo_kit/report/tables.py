"""The report's two tables: one row per run, and one row per variant (the runs that differ only by their seed).

Rows are plain dicts, so the same rows become runs.csv / variants.csv and the tables of report.md.
"""

import csv
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from grpo_kit.report.collect import Run

RUN_COLUMNS = [
    "run",
    "variant",
    "seed",
    "status",
    "reward_failed_steps",
    "final_reward",
    "best_reward",
    "eval_reward",
    "steps",
    "wall_time_s",
    "tokens_per_s",
    "overrides",
    "error",
]
# Each summary number of a variant is the mean and the std over its completed runs (its seeds).
SUMMARIES = ["final_reward", "best_reward", "eval_reward", "wall_time_s", "tokens_per_s"]
VARIANT_COLUMNS = (
    ["variant", "runs", "ok", "failed", "incomplete", "seeds"]
    + [f"{name}_{stat}" for name in SUMMARIES for stat in ("mean", "std")]
    + ["overrides"]
)


@dataclass
class Variant:
    label: str  # the overrides that set this variant apart from the sweep's other variants
    overrides: tuple[str, ...]  # all of its overrides but the seed
    runs: list[Run]

    @property
    def completed(self) -> list[Run]:
        return [run for run in self.runs if run.status == "ok"]


def group_variants(runs: list[Run]) -> tuple[list[Variant], list[str]]:
    """The variants in the order of their first run, and the overrides that every run shares."""
    groups: dict[frozenset, list[Run]] = {}
    for run in runs:
        groups.setdefault(frozenset(run.variant_overrides), []).append(run)
    shared = [o for o in runs[0].variant_overrides if all(o in run.variant_overrides for run in runs)] if runs else []
    variants = []
    for members in groups.values():
        overrides = members[0].variant_overrides
        distinct = [o for o in overrides if o not in shared]
        # A sweep of one variant has nothing to tell it apart: name it by what it ran.
        label = " ".join(distinct) or " ".join(shared) or "defaults"
        variants.append(Variant(label, overrides, members))
    return variants, shared


def run_rows(runs: list[Run], variants: list[Variant]) -> list[dict]:
    label_of = {id(run): variant.label for variant in variants for run in variant.runs}
    return [
        {
            "run": run.name,
            "variant": label_of[id(run)],
            "seed": run.seed,
            "status": run.status,
            "reward_failed_steps": run.reward_failed_steps,
            "final_reward": run.final_reward,
            "best_reward": run.best_reward,
            "eval_reward": run.eval_reward,
            "steps": run.steps[-1] if run.steps else 0,
            "wall_time_s": run.wall_time,
            "tokens_per_s": run.tokens_per_second,
            "overrides": " ".join(run.overrides),
            "error": run.error_message,
        }
        for run in runs
    ]


def variant_rows(variants: list[Variant]) -> list[dict]:
    """One row per variant, best final reward first; a variant with no completed run comes last."""
    rows = []
    for variant in variants:
        statuses = [run.status for run in variant.runs]
        row = {
            "variant": variant.label,
            "runs": len(variant.runs),
            "ok": statuses.count("ok"),
            "failed": statuses.count("failed"),
            "incomplete": statuses.count("incomplete"),
            "seeds": " ".join(str(run.seed) for run in variant.runs),
            "overrides": " ".join(variant.overrides),
        }
        values = {
            "final_reward": [run.final_reward for run in variant.completed],
            "best_reward": [run.best_reward for run in variant.completed],
            "eval_reward": [run.eval_reward for run in variant.completed],
            "wall_time_s": [run.wall_time for run in variant.completed],
            "tokens_per_s": [run.tokens_per_second for run in variant.completed],
        }
        for name in SUMMARIES:
            row[f"{name}_mean"], row[f"{name}_std"] = mean_and_std(values[name])
        rows.append(row)
    return sorted(rows, key=lambda row: math.inf if math.isnan(row["final_reward_mean"]) else -row["final_reward_mean"])


def mean_and_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample std (n - 1) of the finite values; the std of a single value is NaN, not 0."""
    present = [value for value in values if not math.isnan(value)]
    if not present:
        return math.nan, math.nan
    return statistics.fmean(present), statistics.stdev(present) if len(present) > 1 else math.nan


def write_csv(path: Path, rows: list[dict], columns: list[str]) -> Path:
    with path.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow({name: csv_value(row.get(name)) for name in columns})
    return path


def csv_value(value):
    """Numbers at a precision a person can read; NaN as an empty cell, which spreadsheets and pandas read as missing."""
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.6g}"
    return "" if value is None else value
