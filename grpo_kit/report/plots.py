"""The report's figures: one PNG per metric, a line per variant, over the optimizer steps.

Each run's raw per-step values are smoothed with a centred moving average (per-step rewards of a small batch are
noisy); a variant's line is the mean of its runs' smoothed curves and its band the min-max over them, so the band
shows how much the seed alone moves the curve. Every figure says how many seeds each line stands for. A metric that
is zero at every logged step of every run is not drawn (a flat line at zero says nothing a sentence cannot): the
report names it instead. matplotlib is imported here only, so the rest of the report works without it; figures are
drawn with its object API and saved by the Agg renderer (PNG files, no window), never through pyplot, so a caller's
backend and pyplot's open figures are left alone.
"""

import fnmatch
import math
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from grpo_kit.report.collect import Run
from grpo_kit.report.tables import Variant

# A curve through fewer logged points than this (an evaluation every 100 steps) gets a marker on each: a line
# alone would pass for a measurement at every step in between.
SPARSE_POINTS = 20


@dataclass(frozen=True)
class Figure:
    filename: str
    title: str
    ylabel: str
    # The first of these a variant's runs logged is drawn: losses log different clip ratios. A pattern (with *)
    # matches any metric of that form, so a new loss's `NAME_clip_ratio` is drawn without naming it here.
    metrics: tuple[str, ...]


FIGURES = [
    Figure("reward.png", "Reward", "mean reward of the step's completions", ("reward",)),
    Figure("eval_reward.png", "Reward on the eval set", "mean reward of the eval completions", ("eval/reward",)),
    Figure("completion_length.png", "Completion length", "tokens per completion (mean)", ("completions/mean_length",)),
    Figure(
        "flat_groups.png",
        "Groups whose rewards are all equal",
        "share of the step's groups (no advantage, no gradient)",
        ("frac_reward_zero_std",),
    ),
    Figure("kl.png", "KL divergence to the reference model", "KL (k3 estimate, per token)", ("kl",)),
    Figure("entropy.png", "Policy entropy", "entropy (nats per token)", ("entropy",)),
    Figure("clip_ratio.png", "Clipped tokens", "share of tokens clipped", ("clip_ratio/region_mean", "*_clip_ratio")),
    Figure(
        "gradient_noise_scale.png",
        "Gradient noise scale (+diagnostics=gradient)",
        "tr(Sigma) / |G|^2, in completions",
        ("grad/noise_scale",),
    ),
]


def smoothing_window(num_steps: int) -> int:
    """About a twentieth of the run: enough to see the trend through per-step noise, not so much to hide it."""
    return max(1, num_steps // 20)


def moving_average(values: np.ndarray, window: int) -> np.ndarray:
    """Centred moving average that skips NaN and shrinks at the ends, so the curve keeps its length and its ends."""
    if window <= 1:
        return values.astype(float)
    present = ~np.isnan(values)
    kernel = np.ones(window)
    sums = np.convolve(np.where(present, values, 0.0), kernel, mode="same")
    counts = np.convolve(present.astype(float), kernel, mode="same")
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / counts, np.nan)


@dataclass
class Figures:
    drawn: dict  # file name -> matplotlib Figure, the final reward first: report.md shows them in this order
    all_zero: list[str]  # the metrics left out: zero at every step that logged them, in every run


def write_plots(variants: list[Variant], directory: Path, subtitle: str = "") -> tuple[list[Path], list[str]]:
    """The figures of the metrics some run logged, written into `directory`: the paths written, and the metrics
    left out because they were zero throughout."""
    figures = draw_figures(variants, subtitle)
    for filename, fig in figures.drawn.items():
        fig.savefig(directory / filename, bbox_inches="tight")
    return [directory / filename for filename in figures.drawn], figures.all_zero


def draw_figures(variants: list[Variant], subtitle: str = "") -> Figures:
    from matplotlib.figure import Figure as MatplotlibFigure

    # One colour per variant, the same in every figure.
    colour_of = dict(zip((variant.label for variant in variants), colours(len(variants))))
    all_zero = all_zero_metrics([run for variant in variants for run in variant.runs])
    drawn, left_out = {}, []
    if "reward" not in all_zero:
        final = _final_reward_figure(variants, colour_of, subtitle)
        drawn |= {"final_reward.png": final} if final is not None else {}
    for figure in FIGURES:
        left_out += [
            name for name in sorted(all_zero) if any(fnmatch.fnmatch(name, pattern) for pattern in figure.metrics)
        ]
        curves = [
            (variant, colour_of[variant.label], _curve(variant, figure.metrics, all_zero)) for variant in variants
        ]
        curves = [(variant, colour, curve) for variant, colour, curve in curves if curve is not None]
        if not curves:
            continue  # no run logged this metric (kl needs algorithm.beta > 0, clip ratios a clipped loss)
        fig = MatplotlibFigure(figsize=(10, 5.5), dpi=110)
        ax = fig.subplots()
        windows = set()
        metrics = {curve.metric for _, _, curve in curves}
        for variant, colour, curve in curves:
            windows.add(curve.window)
            # Name the metric in the legend only when the variants log different ones (clip ratios).
            label = f"{variant.label} ({curve.metric})" if len(metrics) > 1 else variant.label
            label += f"  (n={len(curve.runs)})"
            if len(curve.runs) > 1:
                ax.fill_between(curve.steps, curve.low, curve.high, color=colour, alpha=0.18, linewidth=0)
            ax.plot(curve.steps, curve.mean, color=colour, linewidth=1.8, label=label, **point_markers(curve.steps))
        smoothing = "/".join(str(window) for window in sorted(windows))
        smoothed = "the logged values" if windows == {1} else f"moving average over {smoothing} logged values"
        seeds = seeds_note(len(curve.runs) for _, _, curve in curves)
        how_to_read = f"{seeds}; lines: mean over seeds; bands: min-max over seeds; {smoothed}"
        titles(fig, ax, figure.title, subtitle, how_to_read)
        step_axis(ax)
        # Which of the figure's metrics it shows, when it could be one of several and all variants share it.
        shared_metric = len(figure.metrics) > 1 and len(metrics) == 1
        ax.set_ylabel(f"{figure.ylabel}\n({metrics.pop()})" if shared_metric else figure.ylabel)
        ax.grid(True, alpha=0.3)
        # Beside the axes, not on them: a sweep has many variants and the curves need the room.
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
        fig.tight_layout()
        drawn[figure.filename] = fig
    return Figures(drawn, list(dict.fromkeys(left_out)))


def all_zero_metrics(runs: list[Run]) -> set[str]:
    """The metrics some run logged, and every logged value of which, in every run, is zero."""
    logged = {name for run in runs for line in run.metrics for name in line} - {"step"}
    values_of = {
        name: {value for run in runs for value in run.series(name)[1] if not math.isnan(value)} for name in logged
    }
    return {name for name, values in values_of.items() if values == {0.0}}


def step_axis(ax) -> None:
    """An x axis of optimizer steps, which are whole: no tick at step 2.5 on a short run."""
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel("optimizer step")
    # min_n_ticks=1: by default a view with fewer than two whole steps in it (one evaluation) gets fractional ticks.
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))


def point_markers(steps) -> dict:
    """plot() keywords that mark each point of a sparse curve."""
    return {"marker": "o", "markersize": 4} if len(steps) < SPARSE_POINTS else {}


def seeds_note(counts) -> str:
    """How many seeds each variant's line or dot stands for: "3 seeds each", or the range when they differ."""
    counts = sorted(set(counts))
    if len(counts) == 1:
        return f"{counts[0]} seed each" if counts[0] == 1 else f"{counts[0]} seeds each"
    return f"{counts[0]}-{counts[-1]} seeds per variant (n beside each name)"


@dataclass
class Curve:
    metric: str
    runs: list
    window: int
    steps: np.ndarray
    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray


def _curve(variant: Variant, metrics: tuple[str, ...], left_out: set[str] = frozenset()) -> Curve | None:
    """A variant's smoothed curve of the first of `metrics` its runs logged, but those `left_out`; None when they
    logged none."""
    runs = [run for run in variant.runs if run.steps]  # a run that failed before its first step has no curve
    logged = sorted({name for run in runs for line in run.metrics for name in line} - left_out)
    candidates = [name for pattern in metrics for name in fnmatch.filter(logged, pattern)]
    metric = next((name for name in candidates if any(run.has(name) for run in runs)), None)
    if metric is None:
        return None
    # Only the steps that logged the metric: an evaluation every 50 steps is a curve through its points, not gaps.
    points = {
        run.name: [(step, value) for step, value in zip(*run.series(metric)) if not math.isnan(value)]
        for run in runs
        if run.has(metric)
    }
    runs = [run for run in runs if run.name in points]
    steps = np.array(sorted({step for run in runs for step, _ in points[run.name]}))
    index = {step: position for position, step in enumerate(steps)}
    window = smoothing_window(len(steps))
    grid = np.full((len(runs), len(steps)), np.nan)  # runs x steps; a run that stopped early leaves NaN
    for row, run in enumerate(runs):
        run_steps, values = zip(*points[run.name])
        smoothed = moving_average(np.array(values, dtype=float), window)
        for step, value in zip(run_steps, smoothed):
            grid[row, index[step]] = value
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a step no run has: all-NaN column, drawn as a gap
        return Curve(metric, runs, window, steps, np.nanmean(grid, 0), np.nanmin(grid, 0), np.nanmax(grid, 0))


def _final_reward_figure(variants, colour_of, subtitle):
    """Final reward per variant, best on top: a dot per seed, the mean as a bar across them, whiskers +/- std.

    The reward axis spans 0 to 1 (and any dot or whisker outside it), never just the range of the dots: zoomed in on a
    few hundredths, one seed's noise looks like a gap between variants. The dots and whiskers show the spread, and
    the mean is written beside its bar, so a small difference can still be read.
    """
    rows = []
    for variant in variants:
        finals = [run.final_reward for run in variant.completed if not math.isnan(run.final_reward)]
        if finals:
            rows.append((variant.label, finals, colour_of[variant.label]))
    if not rows:
        return None
    from matplotlib.figure import Figure as MatplotlibFigure

    rows.sort(key=lambda row: np.mean(row[1]))
    every_final = [final for _, finals, _ in rows for final in finals]
    whiskers = [
        np.mean(finals) + side * np.std(finals, ddof=1) for _, finals, _ in rows if len(finals) > 1 for side in (-1, 1)
    ]
    low, high = min(0.0, *every_final, *whiskers), max(1.0, *every_final, *whiskers)
    fig = MatplotlibFigure(figsize=(10, max(2.8, 0.45 * len(rows) + 1.8)), dpi=110)
    ax = fig.subplots()
    for position, (label, finals, colour) in enumerate(rows):
        mean = np.mean(finals)
        if len(finals) > 1:
            ax.errorbar(mean, position, xerr=np.std(finals, ddof=1), color="0.2", capsize=4, linewidth=1, zorder=2)
        ax.scatter(finals, [position] * len(finals), color=colour, edgecolor="black", linewidth=0.5, s=30, zorder=3)
        ax.scatter([mean], [position], marker="|", color="black", s=400, linewidth=2.5, zorder=4)
        ax.annotate(f"{mean:.3f}", (mean, position), xytext=(0, 9), textcoords="offset points", ha="center", fontsize=8)
    ax.set_yticks(range(len(rows)), [f"{label}  (n={len(finals)})" for label, finals, _ in rows], fontsize=8)
    ax.set_ylim(-0.7, len(rows) - 0.3)
    margin = 0.03 * (high - low)  # so that a dot at 0 or 1 is not cut in half by the frame
    ax.set_xlim(low - margin, high + margin)
    ax.set_xlabel("final reward (mean reward of the last tenth of the logged steps)")
    seeds = seeds_note(len(finals) for _, finals, _ in rows)
    titles(
        fig,
        ax,
        "Final reward per variant",
        subtitle,
        f"completed runs: {seeds}; dots: seeds; black bar: their mean; whiskers: +/- std",
    )
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def titles(fig, ax, title: str, subtitle: str, how_to_read: str) -> None:
    """The figure's title (with the sweep it comes from), and under it a line on how to read it."""
    fig.suptitle(f"{title}  ({subtitle})" if subtitle else title, fontsize=12, x=0.01, ha="left")
    ax.set_title(how_to_read, fontsize=8, color="0.35", loc="left")


def colours(count: int) -> list:
    """Distinct colours: tab10 up to ten variants, tab20 up to twenty, then a continuous map."""
    import matplotlib

    if count <= 10:
        return [matplotlib.colormaps["tab10"](index) for index in range(count)]
    if count <= 20:
        return [matplotlib.colormaps["tab20"](index) for index in range(count)]
    return [matplotlib.colormaps["turbo"](index / max(1, count - 1)) for index in range(count)]
