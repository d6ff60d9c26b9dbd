"""Sweep reports: tables and figures that compare the runs of a Hydra sweep, so nobody has to read the logs.

    write_report(sweep_dir)     report.md, runs.csv, variants.csv and PNG figures, written into sweep_dir
                                (and paired.csv when runs trained on frozen rollouts)
    grpo-kit report DIR         the same from the shell (grpo_kit/report/command.py)
    ReportCallback              writes it when a sweep ends (grpo_kit/report/callback.py)
    final_reward(run_dir)       what a run returns to the sweeper (Optuna maximises it)

collect.py reads run directories, tables.py makes the rows, plots.py the figures (matplotlib, optional),
paired.py and paired_plots.py the differences of runs on frozen rollouts from a baseline, markdown.py the report,
build.py puts them together.
"""

from grpo_kit.contract.errors import ReportError
from grpo_kit.report.build import write_report
from grpo_kit.report.collect import final_reward
from grpo_kit.report.command import main

__all__ = ["ReportError", "final_reward", "main", "write_report"]
