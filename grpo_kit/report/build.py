"""write_report: a sweep directory in, report.md + runs.csv + variants.csv (+ paired.csv) + PNG figures out."""

import logging
from pathlib import Path

from grpo_kit.contract.errors import ReportError
from grpo_kit.report import bands, markdown, paired, tables
from grpo_kit.report.collect import find_runs

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'grpo-kit[sweeps]' (or pip install matplotlib)"


def write_report(
    sweep_dir: Path, plots: bool = True, baseline: str | None = None, band: Path | None = None
) -> list[Path]:
    """Write the sweep's report into `sweep_dir` and return the files written, report.md first.

    `sweep_dir` is a Hydra multirun directory (its runs in subfolders 0/, 1/, ...) or a single run's directory.
    Without matplotlib the tables are still written and report.md says how to get the figures. When runs trained
    on frozen rollouts (rollout_files.replay), the other variants are compared with `baseline` (a variant's label or
    overrides only it has; by default the first label in sorted order) step by step: paired.csv and figures.
    `band` (a recipe's tests/recipe_bands/NAME.json) adds a section and band.png drawing every run against it.
    """
    sweep_dir = Path(sweep_dir)
    runs = find_runs(sweep_dir)
    if not runs:
        raise ReportError(
            f"No runs in {sweep_dir}: a run's folder holds metrics.jsonl, config.yaml, .hydra/ or error.txt. "
            "Give the sweep's directory (multirun/DATE/TIME) or one run's (outputs/DATE/TIME)."
        )
    variants, shared = tables.group_variants(runs)
    run_rows = tables.run_rows(runs, variants)
    variant_rows = tables.variant_rows(variants)
    comparison = paired.compare(variants, baseline)  # before any file is written: a bad --baseline writes nothing
    reference = bands.Band.read(band) if band is not None else None  # a bad --band writes nothing either
    written = [
        tables.write_csv(sweep_dir / "runs.csv", run_rows, tables.RUN_COLUMNS),
        tables.write_csv(sweep_dir / "variants.csv", variant_rows, tables.VARIANT_COLUMNS),
    ]
    if comparison is not None:
        written.append(tables.write_csv(sweep_dir / "paired.csv", comparison.rows(), paired.COLUMNS))

    figures, paired_figures, notes, all_zero = [], [], [], []
    if plots:
        try:
            import matplotlib  # noqa: F401  only the figures need it, and it is an optional dependency
        except ImportError as error:
            notes.append(f"No figures: {error}. Install matplotlib for them: {INSTALL_HINT}.")
            log.warning("The sweep report has no figures: %s. %s", error, INSTALL_HINT)
        else:
            from grpo_kit.report.instrument_plots import write_instrument_plots
            from grpo_kit.report.plots import write_plots
            from grpo_kit.report.staleness_plots import write_staleness_plots

            figures, all_zero = write_plots(variants, sweep_dir, subtitle=sweep_name(sweep_dir))
            figures += write_instrument_plots(variants, sweep_dir, subtitle=sweep_name(sweep_dir))
            figures += write_staleness_plots(variants, sweep_dir, subtitle=sweep_name(sweep_dir))
            if comparison is not None:
                from grpo_kit.report.paired_plots import write_paired_plots

                paired_figures = write_paired_plots(comparison, variants, sweep_dir, subtitle=sweep_name(sweep_dir))
            if reference is not None:
                from grpo_kit.report.band_plots import write_band_plot

                figures.append(write_band_plot(runs, reference, sweep_dir, subtitle=sweep_name(sweep_dir)))

    report = sweep_dir / "report.md"
    text = markdown.render(
        sweep_dir,
        sweep_name(sweep_dir),
        variants,
        shared,
        run_rows,
        variant_rows,
        figures,
        all_zero,
        notes,
        comparison,
        paired_figures,
    )
    if reference is not None:
        text += "\n".join(bands.band_section(runs, reference, band)) + "\n"
    report.write_text(text)
    return [report, *written, *figures, *paired_figures]


def sweep_name(sweep_dir: Path) -> str:
    """DATE/TIME for multirun/DATE/TIME: the time alone does not say which sweep a figure comes from."""
    return "/".join(sweep_dir.resolve().parts[-2:])
