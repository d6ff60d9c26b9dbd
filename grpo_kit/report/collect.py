"""Reading a sweep directory: which subfolders are runs, and what each run's files say.

A run directory is what `python -m grpo_kit` writes (grpo_kit/training/loop.py and Hydra): `config.yaml` (the resolved
config), `metrics.jsonl` (one JSON object per logged step), `.hydra/overrides.yaml` (the command line of this
run), `error.txt` when the run raised inside a sweep (grpo_kit/cli/main.py), and `eval.json` when `grpo-kit eval`
evaluated its final model (grpo_kit/cli/evaluate.py). This module only reads files: it
never loads a model or runs the trainer, so a report is quick to make of a sweep that is still going.
"""

import json
import logging
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from grpo_kit.config.schema import under_current_names

log = logging.getLogger(__name__)

# A folder holding any of these is a run (a run that failed before training wrote only .hydra/ and error.txt).
RUN_MARKERS = (".hydra", "metrics.jsonl", "error.txt", "config.yaml")
SEED_KEYS = ("seed", "+seed", "++seed")


@dataclass
class Run:
    directory: Path
    name: str  # the directory relative to the sweep directory: "0", "3", or a custom hydra.sweep.subdir
    overrides: list[str]  # this run's command-line overrides, in order, as Hydra recorded them
    config: dict  # config.yaml, else .hydra/config.yaml, else {}
    metrics: list[dict]  # metrics.jsonl, one dict per logged step
    error: str | None  # error.txt's text
    evaluation: dict | None = None  # eval.json: what `grpo-kit eval RUN_DIR` measured of the final model

    @property
    def status(self) -> str:
        """ok, failed (error.txt, or no metrics at all), or incomplete (stopped before its last step)."""
        if self.error is not None or not self.steps:
            return "failed"
        max_steps = self.config.get("trainer", {}).get("max_steps")
        # The trainer always logs its last step, so fewer steps means the run was killed or is still going.
        if isinstance(max_steps, int) and self.steps[-1] < max_steps:
            return "incomplete"
        return "ok"

    @property
    def seed(self):
        for override in self.overrides:
            key, _, value = override.partition("=")
            if key in SEED_KEYS:
                return _number(value)
        return self.config.get("seed")

    @property
    def variant_overrides(self) -> tuple[str, ...]:
        """The overrides that say what was run, less the seed: the runs of one variant differ only by it."""
        return tuple(o for o in self.overrides if o.partition("=")[0] not in SEED_KEYS)

    @property
    def steps(self) -> list[int]:
        return [int(line["step"]) for line in self.metrics if "step" in line]

    def series(self, name: str) -> tuple[list[int], list[float]]:
        """(steps, values) of one metric; a step that did not log it, or logged null, gives NaN."""
        steps, values = [], []
        for line in self.metrics:
            if "step" in line:
                steps.append(int(line["step"]))
                values.append(_float(line.get(name)))
        return steps, values

    @property
    def reward_failed_steps(self) -> int:
        """The logged training steps at which a reward raised or timed out (`rewards/NAME/failures`), or no
        completion had a reward at all (`reward` null): steps that trained on less than the rewards promise."""
        return sum(1 for line in self.metrics if "reward" in line and _reward_failed(line))  # a step-0 eval has none

    def has(self, name: str) -> bool:
        return any(not math.isnan(value) for value in self.series(name)[1])

    @property
    def error_message(self) -> str:
        """The error's last line: the exception and its message."""
        if self.error is None:
            return "" if self.steps else "no logged step: it stopped before its first one (or has only just started)"
        lines = [line.strip() for line in self.error.strip().splitlines() if line.strip()]
        return lines[-1] if lines else "error.txt is empty"

    # The numbers of the runs table ------------------------------------------------------------------------

    @property
    def final_reward(self) -> float:
        """The mean reward of the last tenth of the logged steps (at least one): what the run returns to a sweeper."""
        rewards = self.series("reward")[1]
        return _nanmean(rewards[-max(1, len(rewards) // 10) :])

    @property
    def best_reward(self) -> float:
        """The highest reward of one logged step."""
        present = [value for value in self.series("reward")[1] if not math.isnan(value)]
        return max(present) if present else math.nan

    @property
    def eval_reward(self) -> float:
        """The reward on the eval set at the run's last evaluation (its end); NaN for a run without one."""
        evaluated = [value for value in self.series("eval/reward")[1] if not math.isnan(value)]
        return evaluated[-1] if evaluated else math.nan

    @property
    def wall_time(self) -> float:
        """Seconds spent in the training steps: the sum of seconds_per_step (model loading and saving excluded)."""
        if not self.steps:
            return math.nan  # not 0 s: a run that never trained has no time to compare
        spans = [(span, _float(line.get("seconds_per_step"))) for span, line in self._spans()]
        return sum(span * seconds for span, seconds in spans if not math.isnan(seconds))

    @property
    def completions_per_step(self) -> int | None:
        """Completions one optimizer step trains on, on one process."""
        trainer = self.config.get("trainer", {})
        batch, accumulation = trainer.get("per_device_train_batch_size"), trainer.get("gradient_accumulation_steps")
        return batch * accumulation if isinstance(batch, int) and isinstance(accumulation, int) else None

    @property
    def tokens_per_second(self) -> float:
        """Generated completion tokens per second of training: mean length x completions per step / seconds."""
        completions = self.completions_per_step
        tokens = seconds = 0.0
        for span, line in self._spans():
            length, spent = _float(line.get("completions/mean_length")), _float(line.get("seconds_per_step"))
            if completions is not None and not math.isnan(length) and not math.isnan(spent):
                tokens += length * completions * span
                seconds += spent * span
        return tokens / seconds if seconds > 0 else math.nan

    def _spans(self):
        """(optimizer steps covered, line) per logged line: with logging_steps > 1 a line is the mean of several."""
        previous = 0
        for line in self.metrics:
            if "step" in line:
                step = int(line["step"])
                yield step - previous, line
                previous = step


def final_reward(run_dir: Path) -> float | None:
    """What a run returns to the sweeper: its final reward, or None when no step of its last tenth has a reward.

    None and not NaN: Optuna's sweeper counts a None as a failed trial and goes on, but stops the whole study on
    a NaN. The same definition as the report's final_reward column, so the search and the report agree.
    """
    value = load_run(Path(run_dir), Path(run_dir)).final_reward
    return None if math.isnan(value) else value


def find_runs(sweep_dir: Path) -> list[Run]:
    """Every run under `sweep_dir` (itself, when it is a single run's directory), in the sweep's job order."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise FileNotFoundError(
            f"{sweep_dir} is not a directory: give the sweep's directory (multirun/DATE/TIME, the one holding "
            "multirun.yaml and the numbered run folders) or one run's directory (outputs/DATE/TIME)."
        )
    directories = []
    for root, folders, files in os.walk(sweep_dir):
        if any(marker in files or marker in folders for marker in RUN_MARKERS):
            directories.append(Path(root))
            folders.clear()  # a run's own subfolders (model/, checkpoints/) hold no runs
        else:
            folders[:] = [folder for folder in folders if not folder.startswith(".")]
    runs = [load_run(directory, sweep_dir) for directory in directories]
    return sorted(runs, key=lambda run: _natural_key(run.name))


def load_run(directory: Path, sweep_dir: Path) -> Run:
    name = directory.relative_to(sweep_dir).as_posix()
    return Run(
        directory=directory,
        name="." if name == "." else name,
        overrides=_read_yaml(directory / ".hydra" / "overrides.yaml", default=[]) or [],
        # The trainer's resolved config.yaml, else the one Hydra composed before the run started (a run that
        # failed early has only that), for the seed and the batch sizes.
        config=under_current_names(
            _read_yaml(directory / "config.yaml", default=None)
            or _read_yaml(directory / ".hydra" / "config.yaml", default=None)
            or {}
        ),
        metrics=_read_metrics(directory / "metrics.jsonl"),
        error=(directory / "error.txt").read_text() if (directory / "error.txt").is_file() else None,
        evaluation=_read_json(directory / "eval.json"),
    )


def _read_json(path: Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        log.warning("%s is not valid JSON, ignored: %s", path, error)
        return None


def _read_yaml(path: Path, default):
    if not path.is_file():
        return default
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        log.warning("%s is not valid YAML, ignored: %s", path, error)
        return default


def _read_metrics(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    lines = []
    for number, text in enumerate(path.read_text().splitlines(), start=1):
        if not text.strip():
            continue
        try:
            lines.append(json.loads(text))
        except json.JSONDecodeError:
            # A run killed while writing leaves half a line at the end: the lines before it still count.
            log.warning("%s line %d is not JSON, skipped (a run killed mid-write?)", path, number)
    return lines


def _reward_failed(line: dict) -> bool:
    failures = [value for name, value in line.items() if name.startswith("rewards/") and name.endswith("/failures")]
    return math.isnan(_float(line["reward"])) or any(_float(value) > 0 for value in failures)


def _float(value) -> float:
    """JSON null (the logger's NaN) and missing values as NaN."""
    try:
        return float(value) if value is not None else math.nan
    except (TypeError, ValueError):
        return math.nan


def _number(text: str):
    try:
        return int(text)
    except ValueError:
        return text


def _nanmean(values) -> float:
    present = [value for value in values if not math.isnan(value)]
    return sum(present) / len(present) if present else math.nan


def _natural_key(name: str):
    """Run 2 before run 10: Hydra numbers a sweep's runs 0, 1, ..., 10 without padding."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", name) if part]
