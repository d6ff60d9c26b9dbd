"""The paired-difference figures: per metric, variant - baseline over the optimizer steps, a line per variant.

The raw per-step differences are drawn, unsmoothed: pairing on the same rollouts already removes the sampling noise
that the other figures smooth away. Colours are the ones the variants have in the other figures.
"""

from pathlib import Path

import numpy as np

from grpo_kit.report.paired import PairedComparison, figure_name
from grpo_kit.report.plots import colours, titles
from grpo_kit.report.tables import Variant


def write_paired_plots(
    paired: PairedComparison, variants: list[Variant], directory: Path, subtitle: str = ""
) -> list[Path]:
    """paired_METRIC.png for each compared metric, written into `directory`; the paths written."""
    from matplotlib.figure import Figure

    colour_of = dict(zip((variant.label for variant in variants), colours(len(variants))))
    written = []
    for metric in paired.metrics:
        fig = Figure(figsize=(10, 5.5), dpi=110)
        ax = fig.subplots()
        ax.axhline(0.0, color="black", linewidth=1.0, label=f"{paired.baseline} (baseline)")
        for difference in paired.differences:
            if difference.metric != metric:
                continue
            steps = np.array(difference.steps)
            at_step = [difference.at(step) for step in difference.steps]  # (steps,) lists of one value per seed
            colour = colour_of[difference.variant]
            label = difference.variant
            if len(difference.by_pair) > 1:
                label += f"  [{len(difference.by_pair)} seeds]"
                low, high = np.array([min(v) for v in at_step]), np.array([max(v) for v in at_step])  # (steps,)
                ax.fill_between(steps, low, high, color=colour, alpha=0.18, linewidth=0)
            ax.plot(steps, [np.mean(v) for v in at_step], color=colour, linewidth=1.8, label=label)
        titles(
            fig, ax, f"{metric}: difference vs {paired.baseline} (frozen rollouts)", subtitle,
            "each variant minus the baseline at the same step, seed and rollouts; lines: mean over seeds; "
            "bands: min-max over seeds; raw per-step values",
        )
        ax.set_xlabel("optimizer step")
        ax.set_ylabel(f"{metric}: variant - baseline")
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
        fig.tight_layout()
        path = directory / figure_name(metric)
        fig.savefig(path, bbox_inches="tight")
        written.append(path)
    return written
