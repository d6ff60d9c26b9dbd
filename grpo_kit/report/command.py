"""`grpo-kit report DIR`: write a finished (or running) sweep's report into its directory."""

import argparse
import sys
from pathlib import Path

DESCRIPTION = (
    "Write report.md, runs.csv, variants.csv and PNG figures into a sweep's directory (multirun/DATE/TIME) or a "
    "run's directory: final and best reward, wall time and throughput per run and per variant (runs that differ "
    "only by seed), and the reward, length, KL, entropy and clipping curves; for runs on frozen rollouts "
    "(rollout_files.replay), paired.csv and figures of each variant's differences from a baseline, step by step. "
    "Sweeps write it themselves at the end; run this for a sweep that was stopped, or is still going, or for another "
    "baseline."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", type=Path, metavar="DIR", help="the sweep's (or one run's) directory")
    parser.add_argument("--no-plots", action="store_true", help="tables and report.md only, no PNG figures")
    parser.add_argument(
        "--baseline",
        metavar="VARIANT",
        help="the variant that runs on frozen rollouts are compared with: its label, or overrides only it has "
        "(e.g. 'loss=grpo'); by default the first label in sorted order",
    )
    parser.add_argument(
        "--band",
        type=Path,
        metavar="FILE",
        help="a recipe's reference band (tests/recipe_bands/NAME.json): every run is drawn against it (band.png) "
        "and report.md says which of its values lie outside",
    )


def report_command(args: argparse.Namespace) -> int:
    from grpo_kit.contract.errors import ReportError
    from grpo_kit.report.build import write_report

    try:
        written = write_report(args.directory, plots=not args.no_plots, baseline=args.baseline, band=args.band)
    except (ReportError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"Wrote the report of {args.directory}: open {written[0]}")
    for path in written[1:]:
        print(f"  {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="grpo-kit report", description=DESCRIPTION)
    add_arguments(parser)
    return report_command(parser.parse_args(sys.argv[1:] if argv is None else argv))
