"""The paired-difference figures: per metric, variant - baseline over the optimizer steps, a line per variant.

The raw per-step differences are drawn, unsmoothed: pairing on the same rollouts already removes the sampling noise
that the other figures smooth away. Colours are the ones the variants have in the other figures. A metric no variant
changed at any step has no figure (a flat line on the zero line): the report says so in words.
"""

from pathlib import Path

import numpy as np

from grpo_kit.report.paired import PairedComparison, figure_name
from grpo_kit.report.plots import colours, point_markers, seeds_note, step_axis, titles
from grpo_kit.report.tables import Variant


def write_paired_plots(
    paired: PairedComparison, variants: list[Variant], directory: Path, subtitle: str = ""
) -> list[Path]:
    """paired_METRIC.png for each compared metric that some variant changed, written into `directory`; the paths
    written."""
    written = []
    for filename, fig in draw_paired_figures(paired, variants, subtitle).items():
        fig.savefig(directory / filename, bbox_inches="tight")
        written.append(directory / filename)
    return written


def draw_paired_figures(paired: PairedComparison, variants: list[Variant], subtitle: str = "") -> dict:
    """File name -> matplotlib Figure."""
    from matplotlib.figure import Figure

    colour_of = dict(zip((variant.label for variant in variants), colours(len(variants))))
    drawn = {}
    for metric in paired.metrics:
        if metric in paired.unchanged:
            continue
        fig = Figure(figsize=(10, 5.5), dpi=110)
        ax = fig.subplots()
        ax.axhline(0.0, color="black", linewidth=1.0, label=f"{paired.baseline} (baseline)")
        differences = [difference for difference in paired.differences if difference.metric == metric]
        for difference in differences:
            steps = np.array(difference.steps)
            at_step = [difference.at(step) for step in difference.steps]  # (steps,) lists of one value per seed
            colour = colour_of[difference.variant]
            if len(difference.by_pair) > 1:
                low, high = np.array([min(v) for v in at_step]), np.array([max(v) for v in at_step])  # (steps,)
                ax.fill_between(steps, low, high, color=colour, alpha=0.18, linewidth=0)
            ax.plot(
                steps,
                [np.mean(v) for v in at_step],
                color=colour,
                linewidth=1.8,
                label=f"{difference.variant}  (n={len(difference.by_pair)})",
                **point_markers(steps),
            )
        seeds = seeds_note(len(difference.by_pair) for difference in differences)
        titles(
            fig,
            ax,
            f"{metric}: difference vs {paired.baseline} (frozen rollouts)",
            subtitle,
            f"{seeds}; each variant minus the baseline at the same step, seed and rollouts; lines: mean over seeds; "
            "bands: min-max over seeds; raw per-step values",
        )
        step_axis(ax)
        ax.set_ylabel(f"{metric}: variant - baseline")
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
        fig.tight_layout()
        drawn[figure_name(metric)] = fig
    return drawn
