"""band.png: the runs of a report drawn against a recipe's reference band (grpo_kit/report/bands.py), one panel per
metric: the band's mean and its mean ± k std as a shaded region at the band's steps, the seeds it was made of as
faint dots, and each run's window means as a line with markers, so a run that leaves the band shows where.
"""

from pathlib import Path

from grpo_kit.report.bands import BAND_METRICS, Band, run_label
from grpo_kit.report.collect import Run
from grpo_kit.report.plots import colours, titles

LABELS = {"reward": "reward", "completions/mean_length": "tokens per completion", "entropy": "entropy (nats/token)"}


def write_band_plot(runs: list[Run], band: Band, directory: Path, subtitle: str = "") -> Path:
    path = directory / "band.png"
    draw_band(runs, band, subtitle).savefig(path, bbox_inches="tight")
    return path


def draw_band(runs: list[Run], band: Band, subtitle: str = ""):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(14, 4.8), dpi=110)
    axes = fig.subplots(1, len(BAND_METRICS))
    colour_of = dict(zip((run_label(run) for run in runs), colours(len(runs))))
    for ax, metric in zip(axes, BAND_METRICS):
        low, high = band.bounds(metric)
        ax.fill_between(band.steps, low, high, color="grey", alpha=0.25, label=f"band: mean ± {band.k:g} std")
        ax.plot(band.steps, band.mean[metric], color="grey", linestyle="--", linewidth=1.2, label="band mean")
        for values in band.per_seed.values():  # the band's own seeds, so its width can be judged
            ax.scatter(band.steps, values[metric], color="grey", s=8, alpha=0.6)
        for run in runs:
            values = band.values_of(run)[metric]
            ax.plot(
                band.steps, values, color=colour_of[run_label(run)], marker="o", linewidth=1.6, label=run_label(run)
            )
        ax.set_xticks(band.steps)
        ax.set_xlabel(f"optimizer step (mean of the {band.window} steps up to it)")
        ax.set_ylabel(LABELS[metric])
        ax.grid(True, alpha=0.3)
    how = f"grey: seeds {band.seeds} of the recipe (dots) and their band; lines: the runs of this report"
    titles(fig, axes[0], f"Against the reference band of {band.recipe}", subtitle, how)
    axes[-1].legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    return fig
