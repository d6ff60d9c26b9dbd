"""Hydra callbacks for the end of a sweep: one writes the report into the sweep directory, one finds the runs
that failed, for the command to exit non-zero. Registered in the primary config (grpo_kit/config/compose.py) as

    hydra.callbacks.report: {_target_: grpo_kit.report.callback.ReportCallback}
    hydra.callbacks.failures: {_target_: grpo_kit.report.callback.FailedRuns}

so every `python -m grpo_kit -m ...` sweep ends with a report; `~hydra.callbacks.report` on the command line
turns it off. Hydra builds callbacks for single runs too, so this module imports nothing heavy at import time.
"""

import logging
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger(__name__)

# The folders of the runs that failed in the sweeps of this process, found by FailedRuns for grpo_kit/cli/main.py.
FAILED_RUNS: list[Path] = []


class ReportCallback(Callback):
    def __init__(self, plots: bool = True) -> None:
        self.plots = plots

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        from grpo_kit.report.build import write_report

        sweep_dir = Path(config.hydra.sweep.dir)
        try:
            written = write_report(sweep_dir, plots=self.plots)
        except Exception:
            # The runs are done and saved: a report that fails must not turn the sweep into a failure. The
            # message says how to try again once the cause is fixed.
            log.exception("Could not write the sweep report; retry with `grpo-kit report %s`", sweep_dir)
            return
        log.info("Sweep report: %s", written[0])


class FailedRuns(Callback):
    """The runs of a sweep that failed, from the error.txt each leaves in its folder: they may have run in other
    processes (hydra/launcher=local_parallel) or on other machines (slurm). An error.txt that the sweep did not
    write, left by an earlier sweep into the same directory, keeps the modification time it had when the sweep
    began."""

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        self.before = _error_files(Path(config.hydra.sweep.dir))

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        written = _error_files(Path(config.hydra.sweep.dir))
        FAILED_RUNS.extend(path.parent for path, mtime in written.items() if self.before.get(path) != mtime)


def _error_files(sweep_dir: Path) -> dict[Path, int]:
    return {path: path.stat().st_mtime_ns for path in sorted(sweep_dir.rglob("error.txt"))}
