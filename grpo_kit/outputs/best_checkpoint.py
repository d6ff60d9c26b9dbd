"""Which checkpoint is the best (trainer.metric_for_best_model): the record RUN_DIR/checkpoints/best.json, read and
written at each save, so that a resumed run goes on comparing with the best of the steps before it.

A checkpoint competes with the metric's value logged at its own step: an eval metric where the checkpoint's step
was evaluated, a training metric where it was logged (the config checks make every save step such a step). The
best one is never deleted by save_total_limit (grpo_kit/outputs/checkpoints.py), and load_best_model_at_end makes
its weights the final model/.
"""

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from grpo_kit.contract.errors import ConfigError
from grpo_kit.outputs.checkpoints import PREFIX

BEST = "best.json"  # in RUN_DIR/checkpoints: {"metric", "value", "step", "checkpoint"}


@dataclass(frozen=True)
class BestCheckpoint:
    metric: str
    greater_is_better: bool

    @classmethod
    def of(cls, trainer) -> "BestCheckpoint | None":
        """The trainer's choice; None when no metric is named. greater_is_better follows transformers: true unless
        the metric's name ends in "loss"."""
        if trainer.metric_for_best_model is None:
            return None
        greater = trainer.greater_is_better
        metric = trainer.metric_for_best_model
        return cls(metric, not metric.endswith("loss") if greater is None else greater)

    def judge(self, checkpoints: Path, step: int, metrics: dict | None) -> tuple[Path | None, dict | None]:
        """The best checkpoint once `step`'s is saved into `checkpoints`, judged by the `metrics` logged at `step`,
        and the record to write once it is saved (None: the best is unchanged). `metrics` None: a save the plan did
        not make (a signal stopped the run), which keeps the best as it is."""
        record = read_best(checkpoints)
        if record is not None and record["metric"] != self.metric:  # resumed with another metric: judged afresh
            record = None
        current = None if record is None else checkpoints / record["checkpoint"]
        value = None if metrics is None else metrics.get(self.metric)
        if not _is_number(value) or (record is not None and not self._better(value, record["value"])):
            return current, None
        name = f"{PREFIX}{step:06d}"
        return checkpoints / name, {"metric": self.metric, "value": value, "step": step, "checkpoint": name}

    def check_logged(self, step: int, metrics: dict | None) -> None:
        """After a planned save: the metric must have been logged at its step, or no checkpoint can be judged."""
        if metrics is not None and self.metric not in metrics:
            raise ConfigError(
                f"trainer.metric_for_best_model={self.metric} was not logged at step {step}, whose checkpoint is "
                f"saved. The metrics logged there are: {', '.join(sorted(metrics))}. Name one of them (eval metrics "
                "start with eval/) and resume with trainer.resume=auto trainer.resume_force=true."
            )

    def _better(self, value: float, than: float) -> bool:
        return value > than if self.greater_is_better else value < than


def read_best(checkpoints: Path) -> dict | None:
    path = checkpoints / BEST
    return json.loads(path.read_text()) if path.exists() else None


def write_best(checkpoints: Path, record: dict) -> None:
    staging = checkpoints / f".{BEST}.tmp"  # moved into place: a crash leaves the old record, never half of one
    staging.write_text(json.dumps(record, indent=1))
    os.replace(staging, checkpoints / BEST)


def best_checkpoint(checkpoints: Path) -> Path | None:
    record = read_best(checkpoints)
    return None if record is None else checkpoints / record["checkpoint"]


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)
