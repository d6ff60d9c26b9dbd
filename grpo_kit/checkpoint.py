"""Checkpoints: everything a run needs to go on exactly where it stopped, written so a crash never corrupts one.

A checkpoint is RUN_DIR/checkpoints/step-000123/ with the trainer's whole TrainState (grpo_kit/trainer.py), or
with `trainer.save_only_model` the model's weights only (in model/, for from_pretrained), and a copy of
metrics.jsonl and samples.jsonl so far. It is written into a temporary folder and renamed into place, so a folder
named step-* is always complete; only the newest `keep` are kept. This module also decides whether a run
may use a directory at all (`claim_run_directory`), before anything is written into it.
"""

import json
import logging
import random
import shlex
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from grpo_kit.errors import ConfigError, InputFileError

log = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
PREFIX = "step-"
MODEL = "model"  # a checkpoint's weights when it holds nothing else


def save_checkpoint(run_dir: Path, step: int, write: Callable[[Path], None], keep: int) -> Path:
    """The checkpoint of `step`, whose contents `write` puts into the folder it is given (`write_state`,
    `write_weights`)."""
    root = Path(run_dir) / CHECKPOINTS
    root.mkdir(exist_ok=True)
    final = root / f"{PREFIX}{step:06d}"
    staging = root / f".writing-{PREFIX}{step:06d}"
    shutil.rmtree(staging, ignore_errors=True)  # left by a crash during an earlier attempt
    staging.mkdir()
    try:
        write(staging)
        for name in ("metrics.jsonl", "samples.jsonl"):
            if (Path(run_dir) / name).exists():
                shutil.copy2(Path(run_dir) / name, staging / name)
    except OSError as error:
        shutil.rmtree(staging, ignore_errors=True)
        kept = sorted(root.glob(f"{PREFIX}*"))
        raise OSError(
            error.errno,
            f"The checkpoint of step {step} could not be written ({error.strerror or error}); "
            + (f"the previous checkpoint {kept[-1]} is intact. " if kept else "")
            + "Free some space and resume with trainer.resume=auto.",
        ) from error
    staging.rename(final)
    for old in sorted(root.glob(f"{PREFIX}*"))[:-keep]:
        shutil.rmtree(old)
    return final


def write_state(folder: Path, state: dict, parts: Path | None) -> None:
    torch.save(state, folder / "state.pt")
    if parts is not None:  # accelerator.save_state's folder (FSDP, DeepSpeed), written by every process
        parts.rename(folder / "accelerate")


def write_weights(folder: Path, model, weights: dict, tokenizer) -> None:
    model.save_pretrained(folder / MODEL, state_dict=weights)
    tokenizer.save_pretrained(folder / MODEL)


def holds_weights_only(checkpoint: Path) -> bool:
    return (checkpoint / MODEL).is_dir() and not (checkpoint / "state.pt").exists()


def find_checkpoint(resume: str, run_dir: Path) -> Path | None:
    """`auto`: the newest checkpoint of run_dir, or None; otherwise the checkpoint (or run directory) named."""
    if resume == "auto":
        candidates = sorted((Path(run_dir) / CHECKPOINTS).glob(f"{PREFIX}*"))
        return candidates[-1] if candidates else None
    path = Path(resume)
    if (path / CHECKPOINTS).is_dir():
        path = find_checkpoint("auto", path)
    if path is None or not ((path / "state.pt").exists() or holds_weights_only(path)):
        raise InputFileError(
            f"trainer.resume={resume} is neither a checkpoint (a folder with state.pt) nor a run directory with "
            f"checkpoints: pass RUN_DIR/checkpoints/step-NNNNNN, a run directory, or auto."
        )
    return path


def claim_run_directory(run_dir: Path, resume: str | None) -> Path | None:
    """The checkpoint this run resumes from, or None for a fresh start; refuses, having written nothing, a directory
    that holds a run which trained at least one step and that this run would not continue.

    What a run that failed before its first step left behind (an empty metrics.jsonl, error.txt) does not lock
    the directory: a fresh run or `trainer.resume=auto` starts there from step 0.
    """
    run_dir = Path(run_dir)
    checkpoint = find_checkpoint(resume, run_dir) if resume else None
    if checkpoint is not None and holds_weights_only(checkpoint):
        raise ConfigError(
            f"{checkpoint} holds the model's weights only (trainer.save_only_model=true): no optimizer, schedule, "
            "random generators or data position, so no run can go on from it exactly. Train into another "
            f"directory from these weights with model.name_or_path={checkpoint / MODEL}, or resume from a whole "
            "checkpoint (trainer.save_only_model=false writes them)."
        )
    if checkpoint is not None:
        return checkpoint
    trained = trained_steps(run_dir)
    if trained and resume:
        raise ConfigError(
            f"{run_dir} holds a run that trained {trained} step(s) but no checkpoint to resume from "
            "(trainer.save_steps was 0, or the run stopped before its first save). It is left untouched: train "
            "into another directory with hydra.run.dir=..."
        )
    if trained:
        continuing = (
            "continue it from its last checkpoint with trainer.resume=auto, or " if find_checkpoint("auto", run_dir) else ""
        )
        raise ConfigError(
            f"{run_dir} already holds a run that trained {trained} step(s) (metrics.jsonl); it is left untouched. "
            f"{continuing.capitalize()}choose another directory with hydra.run.dir=..."
        )
    return None


def trained_steps(run_dir: Path) -> int:
    """The last training step that metrics.jsonl of `run_dir` records; 0 when there is none (a step-0 evaluation
    is not training). A line cut short by a kill is skipped."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return 0
    last = 0
    for line in path.read_text().splitlines():
        try:
            last = max(last, int(json.loads(line).get("step", 0)))
        except (ValueError, AttributeError):
            continue
    return last


def resume_command(run_dir: Path) -> str:
    """The command that continues this run: the overrides it was started with (.hydra/overrides.yaml, written by
    the CLI), its directory and trainer.resume=auto."""
    overrides_file = run_dir / ".hydra" / "overrides.yaml"
    overrides = list(OmegaConf.load(overrides_file)) if overrides_file.is_file() else []
    kept = [o for o in overrides if not o.startswith(("trainer.resume=", "hydra.run.dir=", "hydra.sweep.dir="))]
    words = ["python", "-m", "grpo_kit", *kept, "trainer.resume=auto", f"hydra.run.dir={run_dir.resolve()}"]
    return " ".join(shlex.quote(word) for word in words)


def load_checkpoint(path: Path) -> dict:
    return torch.load(Path(path) / "state.pt", weights_only=False)


def restore_run_files(checkpoint: Path, run_dir: Path) -> None:
    """metrics.jsonl and samples.jsonl as they were at the checkpoint: later lines belong to lost steps."""
    for name in ("metrics.jsonl", "samples.jsonl"):
        if (checkpoint / name).exists():
            shutil.copy2(checkpoint / name, Path(run_dir) / name)
        else:
            (Path(run_dir) / name).unlink(missing_ok=True)


# Settings that may change between a run and its resumption without changing what it computes.
RESUMABLE_CHANGES = {
    "trainer.resume", "trainer.resume_force", "trainer.progress_bar", "model.logits", "model.logits_chunk_size"
}


def check_resumable(saved: dict, cfg: DictConfig, checkpoint: Path) -> None:
    """Refuse to resume under other settings (unless trainer.resume_force): the result would be neither run."""
    changed = [
        f"{key}: {before!r} -> {after!r}" + _why_it_matters(key, cfg)
        for key, before, after in _differences(saved, OmegaConf.to_container(cfg, resolve=True))
        if key not in RESUMABLE_CHANGES and not (key in LENGTH_SETTINGS and _schedule_is_constant(cfg))
    ]
    if changed and not cfg.trainer.resume_force:
        raise ConfigError(
            f"{checkpoint} was saved with other settings:\n  " + "\n  ".join(changed)
            + "\nResume with the same settings, or add trainer.resume_force=true to go on with the new ones."
        )
    if changed:
        log.warning("Resuming %s with changed settings:\n  %s", checkpoint, "\n  ".join(changed))


# The run's length: the learning-rate schedule is laid out over it, so a new length bends the schedule mid-way.
LENGTH_SETTINGS = {"trainer.max_steps", "trainer.num_train_epochs"}


def _schedule_is_constant(cfg: DictConfig) -> bool:
    return cfg.trainer.lr_scheduler_type == "constant"  # which takes no warmup (grpo_kit/optimizers.py)


def _why_it_matters(key: str, cfg: DictConfig) -> str:
    if key not in LENGTH_SETTINGS:
        return ""
    return (
        f" (the {cfg.trainer.lr_scheduler_type} learning-rate schedule is laid out over the run's length, so "
        "lengthening a run would bend it mid-way; to make runs extendable, train with "
        "trainer.lr_scheduler_type=constant and trainer.warmup_ratio=0)"
    )


def _differences(before, after, prefix=""):
    if isinstance(before, dict) and isinstance(after, dict):
        for key in sorted(before.keys() | after.keys(), key=str):
            yield from _differences(before.get(key), after.get(key), f"{prefix}{key}.")
    elif before != after:
        yield prefix.rstrip("."), before, after


def random_states() -> dict:
    states = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_random_states(states: dict) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    if "cuda" in states:
        torch.cuda.set_rng_state_all(states["cuda"])
