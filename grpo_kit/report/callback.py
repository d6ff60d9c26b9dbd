"""A Hydra callback that writes the report into the sweep directory once every run of a sweep has ended.

Registered in the primary config (grpo_kit/config.py) as

    hydra.callbacks.report: {_target_: grpo_kit.report.callback.ReportCallback}

so every `python -m grpo_kit -m ...` sweep ends with a report; `~hydra.callbacks.report` on the command line
turns it off. Hydra builds callbacks for single runs too, so this module imports nothing heavy at import time.
"""

import logging
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger(__name__)


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
