"""The instruments' figures (docs/instruments.md), a panel per variant, since each is read against its own run:
- the trained loss and each shadow loss over the steps, and each shadow gradient's cosine with the trained one
  (when some run logged `shadow/NAME/loss`);
- the share of the gradient norm each group of completions contributes (when some run logged `grad/group/`).
A line per metric, the mean over the variant's seeds of their smoothed curves (as in plots.py). The noise scale,
one line per variant, is among plots.py's figures.
"""

import math
import re
from pathlib import Path

from grpo_kit.report.plots import Curve, _curve, colours, step_axis
from grpo_kit.report.tables import Variant

SHADOW_LOSS = re.compile(r"^shadow/([^/]+)/loss$")


def shadow_names(variants: list[Variant]) -> list[str]:
    logged = {name for variant in variants for run in variant.runs for line in run.metrics for name in line}
    return sorted(match.group(1) for name in logged if (match := SHADOW_LOSS.match(name)))


GROUPS = {
    **{f"length quartile {q}": f"grad/group/length_q{q}/share" for q in range(1, 5)},
    "advantage > 0": "grad/group/advantage_positive/share",
    "advantage < 0": "grad/group/advantage_negative/share",
}


def write_instrument_plots(variants: list[Variant], directory: Path, subtitle: str = "") -> list[Path]:
    """The instruments' figures written into `directory` (none when no run logged what they show)."""
    drawn = draw_shadow_figures(variants, subtitle) | draw_group_figure(variants, subtitle)
    for filename, fig in drawn.items():
        fig.savefig(directory / filename, bbox_inches="tight")
    return [directory / filename for filename in drawn]


def draw_shadow_figures(variants: list[Variant], subtitle: str = "") -> dict:
    """File name -> matplotlib Figure: shadow_loss.png, and shadow_grad_cosine.png when gradients were compared."""
    names = shadow_names(variants)
    if not names:
        return {}
    colour_of = dict(zip(["trained", *names], colours(len(names) + 1)))
    losses = {"trained": "loss", **{name: f"shadow/{name}/loss" for name in names}}
    drawn = {
        "shadow_loss.png": _panels(
            variants,
            losses,
            colour_of,
            "Trained and shadow losses",
            subtitle,
            "loss on a step's scale (as `loss` is logged)",
        )
    }
    cosines = {name: f"shadow/{name}/grad_cosine" for name in names}
    if any(_curve(variant, (metric,)) for variant in variants for metric in cosines.values()):
        drawn["shadow_grad_cosine.png"] = _panels(
            variants,
            cosines,
            colour_of,
            "Shadow gradients against the trained gradient",
            subtitle,
            "cosine with the trained loss's gradient, on the step's first micro-batch",
        )
    return drawn


def draw_group_figure(variants: list[Variant], subtitle: str = "") -> dict:
    """gradient_groups.png, when some run logged the diagnostics' group split."""
    if not any(_curve(variant, (metric,)) for variant in variants for metric in GROUPS.values()):
        return {}
    colour_of = dict(zip(GROUPS, colours(len(GROUPS))))
    title = "The gradient each group of completions contributes"
    ylabel = "norm of the group's gradient / the step's"
    return {"gradient_groups.png": _panels(variants, GROUPS, colour_of, title, subtitle, ylabel)}


def _panels(variants: list[Variant], metrics: dict[str, str], colour_of: dict, title: str, subtitle: str, ylabel: str):
    from matplotlib.figure import Figure as MatplotlibFigure

    columns = min(3, len(variants))
    rows = math.ceil(len(variants) / columns)
    fig = MatplotlibFigure(figsize=(5.5 * columns, 3.6 * rows + 0.8), dpi=110)
    axes = fig.subplots(rows, columns, squeeze=False).ravel()
    seeds = set()
    for ax, variant in zip(axes, variants):
        for label, metric in metrics.items():
            curve: Curve | None = _curve(variant, (metric,))
            if curve is None:
                continue
            seeds.add(len(curve.runs))
            width = 2.2 if label == "trained" else 1.5
            ax.plot(curve.steps, curve.mean, color=colour_of[label], linewidth=width, label=label)
        ax.set_title(variant.label, fontsize=9, loc="left")
        ax.set_ylabel(ylabel, fontsize=8)
        ax.grid(True, alpha=0.3)
        step_axis(ax)
        ax.legend(fontsize=7, frameon=False)
    for ax in axes[len(variants) :]:
        ax.set_visible(False)
    count = "/".join(str(n) for n in sorted(seeds))
    how_to_read = f"a panel per variant; each line the mean of {count} seed(s)' smoothed curves"
    fig.suptitle(f"{title}  ({subtitle})" if subtitle else title, fontsize=12, x=0.01, ha="left")
    fig.text(0.01, 0.0, how_to_read, fontsize=8, color="0.35")
    fig.tight_layout()
    return fig
