"""Experiment trackers (tensorboard, wandb, trackio) through accelerate, chosen with `trainer.report_to=[...]`.

None of them is a dependency: `check_trackers` says which package to install before the run does any work, and
the run's Accelerator is built with what `accelerate_trackers` makes of its answer as `log_with`. `TrackerLogger`
is a hook plugin like the loggers in grpo_kit/outputs/loggers.py. Accelerate's init_trackers and log act on the main
process only.

Where each run's records go, under `trainer.project` and named `trainer.run_name`: tensorboard into
RUN_DIR/trackers/PROJECT/ (RUN_DIR/trackers/PROJECT/RUN_NAME/ when a run name is given: tensorboard names a run by
its folder), wandb into RUN_DIR/wandb/, trackio into its own local store. wandb runs as its own settings say:
online when logged in, offline with WANDB_MODE=offline; a run it cannot start stops with how to fix it.
"""

import math
from pathlib import Path

from accelerate.tracking import TensorBoardTracker
from accelerate.utils import is_tensorboard_available, is_trackio_available, is_wandb_available
from omegaconf import DictConfig

from grpo_kit.config.secrets import redacted
from grpo_kit.contract.errors import ConfigError
from grpo_kit.contract.hookspecs import hookimpl

# name -> is its package (of the same name) installed
SUPPORTED = {"tensorboard": is_tensorboard_available, "wandb": is_wandb_available, "trackio": is_trackio_available}


def check_trackers(names: list[str]) -> list[str]:
    """The trackers to pass as Accelerator(log_with=...); a ConfigError before any work if one is unknown or missing.

    Accelerate itself skips a tracker whose package is missing with a debug message only, so a run would train
    for hours and record nothing where the user looks.
    """
    unknown = [name for name in names if name not in SUPPORTED]
    if unknown:
        raise ConfigError(
            f"trainer.report_to: unknown tracker {', '.join(map(repr, unknown))}; the supported ones are "
            f"{', '.join(SUPPORTED)}."
        )
    missing = [name for name in names if not SUPPORTED[name]()]
    if missing:
        raise ConfigError(
            f"trainer.report_to needs a package that is not installed: pip install {' '.join(missing)} "
            f"(or leave {', '.join(missing)} out of trainer.report_to)."
        )
    return list(dict.fromkeys(names))  # a name given twice would start its tracker twice


def accelerate_trackers(names: list[str], t: DictConfig, run_dir: Path) -> list:
    """`names` as Accelerator(log_with=...) takes them: tensorboard as a tracker of its own, since accelerate's
    would write into a folder named after the project only."""
    folder = t.project if t.run_name is None else f"{t.project}/{t.run_name}"
    return [TensorBoardTracker(folder, run_dir / "trackers") if name == "tensorboard" else name for name in names]


class TrackerLogger:
    """Sends the logged metrics of each logging window to the trackers the run's Accelerator was built with."""

    @hookimpl
    def on_train_start(self, run):
        t = run.cfg.trainer
        # By default DATE/TIME, or TIME/JOB in a sweep
        run_name = t.run_name or "/".join(run.directory.resolve().parts[-2:])
        try:
            run.accelerator.init_trackers(
                t.project,
                config=flat_config(redacted(run.cfg)),
                init_kwargs={"wandb": {"dir": str(run.directory), "name": run_name}, "trackio": {"name": run_name}},
            )
        except Exception as error:
            if "wandb" not in t.report_to:
                raise
            # wandb runs as its own settings say, as under TRL: online when logged in, offline when WANDB_MODE says.
            raise ConfigError(
                f"trainer.report_to=[wandb]: wandb could not start ({type(error).__name__}: {error}). Log in "
                "(`wandb login`, or WANDB_API_KEY), or set WANDB_MODE=offline to keep the run in RUN_DIR/wandb/ "
                "for `wandb sync`."
            ) from error

    @hookimpl
    def on_log(self, run, step, metrics):
        # A NaN (a std of one item, say) is no point on a curve; `step` is the x axis, not a metric.
        values = {name: value for name, value in metrics.items() if name != "step" and _finite_number(value)}
        run.accelerator.log(values, step=step)

    @hookimpl
    def on_train_end(self, run):
        # Each tracker's finish, not accelerator.end_training(): that also destroys the process group, which
        # belongs to the trainer, not to a logger.
        for tracker in run.accelerator.trackers:
            tracker.finish()


def flat_config(config: dict, prefix: str = "") -> dict[str, str | int | float | bool]:
    """{"trainer": {"learning_rate": 1e-5}} -> {"trainer/learning_rate": 1e-5}: tensorboard's hparams take scalars
    only, so lists and None become their text."""
    flat = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flat_config(value, f"{name}/"))
        elif isinstance(value, (str, int, float, bool)):
            flat[name] = value
        else:
            flat[name] = str(value)
    return flat


def _finite_number(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)
