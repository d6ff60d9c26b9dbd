"""staleness.png: a forced-staleness sweep's final held-out reward, final training reward and KL to the behaviour
policy against k, one line per rollout correction (grpo_kit/report/staleness.py computes the points).

Each point is the mean over the seeds, with a whisker of ± one std where there are several; the colours follow
the order of the corrections, `none` first.
"""

from pathlib import Path

from grpo_kit.report.plots import colours, seeds_note, titles
from grpo_kit.report.staleness import KL, StalenessCell, staleness_cells
from grpo_kit.report.tables import Variant

PANELS = [
    ("held_out", "final held-out reward (eval/reward)"),
    ("final", "final training reward (last tenth)"),
    ("kl", f"KL to the behaviour policy\n({KL}, mean over steps)"),
]


def write_staleness_plots(variants: list[Variant], directory: Path, subtitle: str = "") -> list[Path]:
    """staleness.png in `directory` when the sweep varies algorithm.forced_staleness; the paths written."""
    cells = staleness_cells(variants)
    if not cells:
        return []
    path = directory / "staleness.png"
    draw_staleness(cells, subtitle).savefig(path, bbox_inches="tight")
    return [path]


def draw_staleness(cells: list[StalenessCell], subtitle: str = ""):
    from matplotlib.figure import Figure

    corrections = list(dict.fromkeys(cell.correction for cell in cells))
    colour_of = dict(zip(corrections, colours(len(corrections))))
    lags = sorted({cell.lag for cell in cells})
    fig = Figure(figsize=(14, 4.8), dpi=110)
    axes = fig.subplots(1, len(PANELS))
    for ax, (name, label) in zip(axes, PANELS):
        for correction in corrections:
            line = [cell for cell in cells if cell.correction == correction]
            means, stds = zip(*(cell.summary(name) for cell in line))
            ax.errorbar(
                [cell.lag for cell in line],
                means,
                yerr=[0.0 if std != std else std for std in stds],  # NaN (one seed): no whisker
                color=colour_of[correction],
                marker="o",
                markersize=4,
                capsize=3,
                linewidth=1.6,
                label=correction,
            )
        ax.set_xticks(lags)
        ax.set_xlabel("forced staleness k (optimizer steps)")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    seeds = seeds_note(len(cell.final) for cell in cells)
    titles(fig, axes[0], "Forced staleness x rollout correction", subtitle, f"{seeds}; points: mean; whiskers: ± std")
    axes[-1].legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8, frameon=False, title="correction")
    fig.tight_layout()
    return fig
