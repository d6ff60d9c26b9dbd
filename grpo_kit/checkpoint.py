"""Checkpoints: everything a run needs to go on exactly where it stopped, written so a crash never corrupts one.

A checkpoint is RUN_DIR/checkpoints/step-000123/ with the model's and optimizer's state, the scheduler, every
random generator, the prompt sampler's order and position, the generation batch still being trained on, the
metrics window and a copy of metrics.jsonl so far. It is written into a temporary folder and renamed into
place, so a folder named step-* is always complete; only the newest `keep` are kept.
"""

import logging
import random
import shutil
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from grpo_kit.compatibility import ConfigError

log = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
PREFIX = "step-"


def save_checkpoint(run_dir: Path, step: int, state: dict, keep: int) -> Path:
    root = Path(run_dir) / CHECKPOINTS
    root.mkdir(exist_ok=True)
    final = root / f"{PREFIX}{step:06d}"
    staging = root / f".writing-{PREFIX}{step:06d}"
    shutil.rmtree(staging, ignore_errors=True)  # left by a crash during an earlier attempt
    staging.mkdir()
    try:
        torch.save({**state, "step": step, "random": random_states()}, staging / "state.pt")
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


def find_checkpoint(resume: str, run_dir: Path) -> Path | None:
    """`auto`: the newest checkpoint of run_dir, or None; otherwise the checkpoint (or run directory) named."""
    if resume == "auto":
        candidates = sorted((Path(run_dir) / CHECKPOINTS).glob(f"{PREFIX}*"))
        return candidates[-1] if candidates else None
    path = Path(resume)
    if (path / CHECKPOINTS).is_dir():
        path = find_checkpoint("auto", path)
    if path is None or not (path / "state.pt").exists():
        raise FileNotFoundError(
            f"trainer.resume={resume} is neither a checkpoint (a folder with state.pt) nor a run directory with "
            f"checkpoints: pass RUN_DIR/checkpoints/step-NNNNNN, a run directory, or auto."
        )
    return path


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
RESUMABLE_CHANGES = {"trainer.resume", "trainer.resume_force", "trainer.max_steps", "trainer.progress_bar"}


def check_resumable(saved: dict, cfg: DictConfig, checkpoint: Path) -> None:
    """Refuse to resume under other settings (unless trainer.resume_force): the result would be neither run."""
    changed = [
        f"{key}: {before!r} -> {after!r}"
        for key, before, after in _differences(saved, OmegaConf.to_container(cfg, resolve=True))
        if key not in RESUMABLE_CHANGES
    ]
    if changed and not cfg.trainer.resume_force:
        raise ConfigError(
            f"{checkpoint} was saved with other settings:\n  " + "\n  ".join(changed)
            + "\nResume with the same settings, or add trainer.resume_force=true to go on with the new ones."
        )
    if changed:
        log.warning("Resuming %s with changed settings:\n  %s", checkpoint, "\n  ".join(changed))


def _differences(before, after, prefix=""):
    if isinstance(before, dict) and isinstance(after, dict):
        for key in sorted(before.keys() | after.keys(), key=str):
            yield from _differences(before.get(key), after.get(key), f"{prefix}{key}.")
    elif before != after:
        yield prefix.rstrip("."), before, after


def random_states() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def restore_random_states(states: dict) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
