"""How a run stops, and what it holds open until then: signals, and the resources closed in one place."""

import enum
import logging
import math
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_kit.outputs.checkpoints import resume_command
from grpo_kit.outputs.completion_tables import CompletionTables
from grpo_kit.outputs.hub import HubPush
from grpo_kit.outputs.loggers import ConsoleLogger
from grpo_kit.outputs.samples import SampleLog
from grpo_kit.report.collect import load_run
from grpo_kit.rollout.evaluation import Evaluator
from grpo_kit.rollout.scoring import Scorer

log = logging.getLogger(__name__)


class StopReason(enum.Enum):
    """Why a run stops before max_steps, having saved a checkpoint to resume from."""

    SIGINT = "SIGINT"
    SIGTERM = "SIGTERM"
    NON_FINITE_LOSSES = "non-finite losses"


class Stopped(KeyboardInterrupt):
    """Raised by `train` when a signal stopped the run: neither finished nor failed, but saved to be resumed. A
    KeyboardInterrupt, so that what stops on Ctrl-C (a notebook, a script's loop over runs) stops on it too.
    `exit_code` is the shell's for a process that a signal ended, 128 + its number: 130 for SIGINT, 143 for SIGTERM."""

    def __init__(self, reason: StopReason, message: str):
        super().__init__(message)
        self.exit_code = 128 + signal.Signals[reason.value]

    @classmethod
    def saved(cls, reason: StopReason, step: int, run_dir: Path) -> "Stopped":
        return cls(reason, f"Stopped by {reason.value} after step {step}; resume with:\n  {resume_command(run_dir)}")


class StopRequest:
    """SIGINT or SIGTERM: finish the step under way, save a checkpoint and stop, instead of dying mid-step. A second
    signal stops at once, without saving, for a run that must not wait for its step to end."""

    def __init__(self):
        self.reason: StopReason | None = None
        self.bad_steps = 0  # non-finite steps in a row (a resumed run counts again)
        self.previous = {sig: signal.signal(sig, self._request) for sig in (signal.SIGINT, signal.SIGTERM)}

    def count_step(self, step: int, finite: bool, max_bad_steps: int) -> None:
        """A step whose loss was not finite was skipped; `max_bad_steps` of them in a row stop the run."""
        self.bad_steps = 0 if finite else self.bad_steps + 1
        if not finite:
            log.warning("Step %d had a non-finite loss: skipping the step (%d in a row)", step, self.bad_steps)
            if self.bad_steps >= max_bad_steps:
                self.reason = self.reason or StopReason.NON_FINITE_LOSSES

    def raise_if_non_finite(self, step: int) -> None:
        if self.reason is StopReason.NON_FINITE_LOSSES:
            raise RuntimeError(
                f"{self.bad_steps} steps in a row had a non-finite loss, so the run stopped after saving a checkpoint "
                f"at step {step}. Lower trainer.learning_rate or check the rewards, then resume with "
                "trainer.resume=auto."
            )

    def _request(self, signum, frame):
        reason = StopReason(signal.Signals(signum).name)
        if self.reason in (StopReason.SIGINT, StopReason.SIGTERM):  # asked a second time
            self.restore()  # a third signal meets the handlers the run started with
            raise Stopped(
                reason,
                f"A second {reason.value} stopped the run at once, without saving the step under way; "
                "trainer.resume=auto goes on from its last checkpoint.",
            )
        self.reason = reason
        log.warning(
            "%s: stopping after the step under way, once it is saved (send it again to stop at once)", reason.value
        )

    def restore(self):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


@dataclass
class Resources:
    """What a run holds open besides the model, closed in one place however the run ends (`with resources:`).

    The run lock (grpo_kit/outputs/plugin_lock.py) is written by `setup`, checkpoints by grpo_kit/training/saving.py,
    rollouts recorded and replayed by the `Rollout`."""

    plugin_manager: Any
    plugins: list  # the metrics loggers (JSONL, console, trackers) and hook plugins, registered for the run
    console: ConsoleLogger
    scorer: Scorer  # its reward workers are stopped at the end
    stop: StopRequest  # SIGINT or SIGTERM: save and stop after the step under way
    generation: Any = None  # the generation backend, once started
    evaluator: Evaluator | None = None  # eval sets, when configured
    samples: SampleLog | None = None  # samples.jsonl and samples.html, on the main process
    hub: HubPush | None = None  # trainer.push_to_hub, on the main process: its uploads are waited for at the end
    completion_tables: CompletionTables | None = None  # trainer.log_completions, on every process

    @property
    def hooks(self):
        """Every registered plugin's hooks: on_step_end, on_log, on_save, ..."""
        return self.plugin_manager.hook

    def record_samples(self, step: int, batch) -> None:
        """A new generation batch's completions in the sample log (on the main process) and the completion tables
        (gathered from every process)."""
        columns = batch.sample_columns(list(self.scorer.rewards))
        if self.samples is not None:
            self.samples.record(step, *columns)
        if self.completion_tables is not None:
            self.completion_tables.remember(step, *columns[:5])

    def __enter__(self) -> "Resources":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        if self.generation is not None:
            self.generation.close()
        self.stop.restore()
        self.console.close()
        self.scorer.close()
        if self.hub is not None:
            self.hub.close()
        for plugin in self.plugins:
            if self.plugin_manager.is_registered(plugin):
                self.plugin_manager.unregister(plugin)


def outcome(run_dir: Path) -> str:
    """The final reward and eval reward a finished run reports, in words."""
    run = load_run(run_dir, run_dir)
    said = [f"final reward {run.final_reward:.3f} (the last tenth of logged steps)"]
    if not math.isnan(run.eval_reward):
        said.append(f"eval reward {run.eval_reward:.3f}")
    return ", ".join(said)
