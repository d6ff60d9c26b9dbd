"""The run's two loggers, hook plugins like any other: metrics.jsonl in the run directory, and the progress bar."""

import json
import math

from tqdm.auto import tqdm

from grpo_kit.contract.hookspecs import hookimpl


class JsonlLogger:
    """One JSON object per logged step in RUN_DIR/metrics.jsonl."""

    @hookimpl
    def on_train_start(self, run):
        self.path = run.directory / "metrics.jsonl" if run.accelerator.is_main_process else None
        if self.path is not None and not run.start_step:
            # A fresh run: the run directory was claimed (grpo_kit/outputs/checkpoints.py), so what is here belongs
            # to an attempt that failed before its first step.
            self.path.write_text("")

    @hookimpl
    def on_log(self, run, step, metrics):
        if self.path is not None:  # opened per line: a run that fails leaves no open file behind
            with self.path.open("a") as file:
                file.write(json.dumps({name: _plain(value) for name, value in metrics.items()}) + "\n")


class ConsoleLogger:
    """A progress bar over the optimizer steps showing the last logged reward and loss (and eval reward)."""

    SHOWN = [
        ("reward", "reward", ".3f"),
        ("loss", "loss", ".4f"),
        ("eval/reward", "eval", ".3f"),
    ]  # metric, label, format
    bar = None

    @hookimpl
    def on_train_start(self, run):
        enabled = run.cfg.trainer.progress_bar and run.accelerator.is_main_process
        self.bar = tqdm(
            total=run.max_steps, initial=run.start_step, desc="grpo_kit", disable=not enabled, mininterval=1.0
        )

    @hookimpl
    def on_step_end(self, run, step, metrics):
        self.bar.update(1)

    @hookimpl
    def on_log(self, run, step, metrics):
        # An evaluation before the first step logs eval metrics only.
        shown = {key: f"{metrics[name]:{spec}}" for name, key, spec in self.SHOWN if name in metrics}
        self.bar.set_postfix(shown, refresh=False)

    @hookimpl
    def on_train_end(self, run):
        self.close()

    def close(self):
        """Also called when a run fails: a bar left open would push the next run's bar down a line."""
        if self.bar is not None:
            self.bar.close()


def _plain(value):
    """JSON has no NaN: a metric with no value (a std of one item, say) is written as null."""
    return None if isinstance(value, float) and not math.isfinite(value) else value
