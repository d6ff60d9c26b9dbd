"""Paired differences for sweeps on frozen rollouts: variant - baseline, seed by seed and step by step.

With `rollout_files.replay=DIR` the runs of a sweep train on the same saved generation batches, so at a given step a
variant and the baseline, with the same seed, saw the same prompts, completions and rewards. The difference of
their losses, KLs, entropies or clip ratios at that step is then the objective's alone, without the sampling noise
that makes the curves of a few seeds hard to tell apart. Runs are paired by (replay directory, seed) and their
metrics by step. The reward, the same under replay by construction, is checked rather than compared.
"""

import fnmatch
import math
import statistics
from dataclasses import dataclass

from grpo_kit.contract.errors import ReportError
from grpo_kit.report.collect import Run
from grpo_kit.report.tables import Variant, mean_and_std

# What the objective can change under replay: its own metrics and what the policy does on the eval set, not the
# rollouts' (reward, lengths). Of the eval metrics, the two a person reads: the others repeat them.
COMPARED = (
    "loss",
    "kl",
    "entropy",
    "clip_ratio/*",
    "*_clip_ratio",
    "grad_norm",
    "eval/reward",
    "eval/completions/mean_length",
)
COLUMNS = ["variant", "metric", "step", "mean_diff", "std_diff", "n_seeds"]


@dataclass
class Pair:
    """A variant's run and the baseline's run with the same seed on the same rollouts."""

    key: tuple[str, object]  # (replay directory, seed)
    run: Run
    baseline: Run


@dataclass
class Difference:
    """variant - baseline of one metric, per pair (a seed on some rollouts) and per step."""

    variant: str
    metric: str
    by_pair: dict[tuple[str, object], dict[int, float]]  # (replay, seed) -> step -> difference, where both logged

    @property
    def steps(self) -> list[int]:
        return sorted({step for differences in self.by_pair.values() for step in differences})

    def at(self, step: int) -> list[float]:
        """The differences of the pairs that logged `step`."""
        return [differences[step] for differences in self.by_pair.values() if step in differences]

    def averaged(self, last_quarter: bool = False) -> tuple[float, float]:
        """Each pair's difference averaged over its steps (or the last quarter of them): their mean and std."""
        averages = []
        for differences in self.by_pair.values():
            values = [differences[step] for step in sorted(differences)]
            averages.append(statistics.fmean(values[-max(1, len(values) // 4) :] if last_quarter else values))
        return mean_and_std(averages)


@dataclass
class PairedComparison:
    baseline: str  # the baseline variant's label
    replays: list[str]  # the rollouts directories the pairs trained on
    differences: list[Difference]  # variant by variant in the sweep's order, metric by metric in COMPARED's
    reward_mismatches: list[str]  # pairs whose rewards differ, so they did not see the same rollouts
    unpaired: list[str]  # variants on frozen rollouts with no seed on the baseline's rollouts

    @property
    def metrics(self) -> list[str]:
        return list(dict.fromkeys(difference.metric for difference in self.differences))

    @property
    def unchanged(self) -> list[str]:
        """The metrics that every variant logged exactly as the baseline did, at every paired step."""
        return [
            metric
            for metric in self.metrics
            if all(
                value == 0.0
                for difference in self.differences
                if difference.metric == metric
                for values in difference.by_pair.values()
                for value in values.values()
            )
        ]

    def rows(self) -> list[dict]:
        """paired.csv: per variant, metric and step, the mean and std over seeds of the difference."""
        rows = []
        for difference in self.differences:
            for step in difference.steps:
                values = difference.at(step)
                mean, std = mean_and_std(values)
                rows.append(
                    {
                        "variant": difference.variant,
                        "metric": difference.metric,
                        "step": step,
                        "mean_diff": mean,
                        "std_diff": std,
                        "n_seeds": len(values),
                    }
                )
        return rows


def compare(variants: list[Variant], baseline: str | None = None) -> PairedComparison | None:
    """Every variant on frozen rollouts against the baseline (the first label in sorted order unless `baseline`
    names one); None when fewer than two variants have a completed run on frozen rollouts."""
    replaying = [variant for variant in variants if _replaying(variant)]
    if len(replaying) < 2:
        if baseline is not None:
            raise ReportError(
                f"--baseline {baseline!r}: paired differences need two variants with completed runs on frozen "
                f"rollouts (rollout_files.replay=DIR), and this sweep has {len(replaying)}. Leave --baseline out."
            )
        return None
    base = find_baseline(replaying, baseline) if baseline is not None else min(replaying, key=lambda v: v.label)
    on_baseline = {}
    for run in _replaying(base):
        on_baseline.setdefault((replay_of(run), run.seed), run)
    differences, mismatches, unpaired, replays = [], [], [], set()
    for variant in replaying:
        if variant is base:
            continue
        pairs = []
        for run in _replaying(variant):
            key = (replay_of(run), run.seed)
            if key in on_baseline:
                pairs.append(Pair(key, run, on_baseline[key]))
                replays.add(key[0])
        if not pairs:
            unpaired.append(variant.label)
            continue
        mismatches += [mismatch for pair in pairs if (mismatch := _reward_mismatch(variant.label, pair))]
        for metric in _compared_metrics(pairs):
            by_pair = {pair.key: _differences(pair, metric) for pair in pairs}
            by_pair = {key: values for key, values in by_pair.items() if values}
            if by_pair:
                differences.append(Difference(variant.label, metric, by_pair))
    return PairedComparison(base.label, sorted(replays), differences, mismatches, unpaired)


def find_baseline(variants: list[Variant], name: str) -> Variant:
    """The variant `name` names: by its label, else by overrides only it has (`loss=grpo` finds `+loss=grpo ...`)."""
    wanted = {_bare(override) for override in name.split()}
    matches = [variant for variant in variants if {_bare(o) for o in variant.label.split()} == wanted]
    matches = matches or [variant for variant in variants if wanted <= {_bare(o) for o in variant.overrides}]
    if len(matches) != 1:
        found = "none" if not matches else f"{len(matches)}"
        labels = ", ".join(f"'{variant.label}'" for variant in variants)
        raise ReportError(
            f"--baseline {name!r} matches {found} of the variants trained on frozen rollouts: {labels}. "
            "Give one of them (or overrides that only it has)."
        )
    return matches[0]


def figure_name(metric: str) -> str:
    """paired_clip_ratio_region_mean.png for clip_ratio/region_mean: a file name has no folders in it."""
    return f"paired_{metric.replace('/', '_')}.png"


def replay_of(run: Run) -> str | None:
    """The rollouts directory a run trained on, from its resolved config."""
    return (run.config.get("rollout_files") or {}).get("replay")


def _replaying(variant: Variant) -> list[Run]:
    # Completed runs only, as in the variants table: a run still going would average over fewer steps.
    return [run for run in variant.completed if replay_of(run)]


def _bare(override: str) -> str:
    """`+loss=grpo` and `loss=grpo` name the same choice: the user need not remember which one took a `+`."""
    return override.lstrip("+")


def _compared_metrics(pairs: list[Pair]) -> list[str]:
    runs = [run for pair in pairs for run in (pair.run, pair.baseline)]
    logged = sorted({name for run in runs for line in run.metrics for name in line})
    return list(dict.fromkeys(name for pattern in COMPARED for name in fnmatch.filter(logged, pattern)))


def _differences(pair: Pair, metric: str) -> dict[int, float]:
    """step -> run - baseline, at the steps where both logged a value."""
    baseline = dict(zip(*pair.baseline.series(metric)))
    differences = {}
    for step, value in zip(*pair.run.series(metric)):
        difference = value - baseline.get(step, math.nan)
        if not math.isnan(difference):
            differences[step] = difference
    return differences


def _reward_mismatch(label: str, pair: Pair) -> str | None:
    """A line for the report when the pair's rewards differ at some step (None when they agree everywhere)."""
    ours, theirs = dict(zip(*pair.run.series("reward"))), dict(zip(*pair.baseline.series("reward")))
    common = sorted(ours.keys() & theirs.keys())
    differing = [step for step in common if not _same(ours[step], theirs[step])]
    if not differing:
        return None
    first = differing[0]
    return (
        f"`{label}` seed {pair.key[1]}: reward differs from the baseline's at {len(differing)} of {len(common)} steps "
        f"(first at step {first}: {ours[first]:.6g} vs {theirs[first]:.6g})"
    )


def _same(value: float, other: float) -> bool:
    """Equal up to float noise; a step with no reward (NaN) in both runs counts as the same."""
    return (math.isnan(value) and math.isnan(other)) or math.isclose(value, other, rel_tol=1e-9, abs_tol=1e-12)
