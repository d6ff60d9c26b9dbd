"""Checkpoints: everything a run needs to go on exactly where it stopped, written so a crash never corrupts one.

A checkpoint is RUN_DIR/checkpoints/step-000123/ with the trainer's whole TrainState (grpo_kit/training/state.py): its
tensors and plain data in state.pt, the run's config in config.json; or with `trainer.save_only_model` the model's
weights only (in model/, for from_pretrained). Both hold a copy of metrics.jsonl and samples.jsonl so far, and
manifest.json, the sha256 of every other file. It is written into a temporary folder and renamed into place, so a
folder named step-* is always complete; only the newest `keep` are kept. A checkpoint damaged since (a bad disk, a
file cut short or deleted) no longer matches its manifest: `trainer.resume=auto` skips it for the newest intact
one, and naming it is refused. state.pt is read with `torch.load(weights_only=True)`, so that a crafted file cannot
run code.

This module also decides whether a run may use a directory at all (`claim_run_directory`), before anything is
written into it, and locks the directory against a second run for as long as the run lasts.
"""

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import pickle
import random
import shlex
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from safetensors import SafetensorError

from grpo_kit.config.schema import under_current_names
from grpo_kit.config.secrets import REDACTED, redacted
from grpo_kit.contract.distributed import is_main_process
from grpo_kit.contract.errors import ConfigError, InputFileError

log = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
PREFIX = "step-"
MODEL = "model"  # a checkpoint's weights when it holds nothing else
STATE = "state.pt"
CONFIG = "config.json"
MANIFEST = "manifest.json"  # {"format": FORMAT, "sha256": {path: digest}} of every other file, written last
FORMAT = 2  # how state.pt lays out the TrainState; a checkpoint of another format cannot be resumed
LOCK = ".lock"  # RUN_DIR/.lock, locked by the run that uses the directory and holding its pid


def save_checkpoint(
    run_dir: Path, step: int, write: Callable[[Path], None], keep: int, protect: Path | None = None
) -> Path:
    """The checkpoint of `step`, whose contents `write` puts into the folder it is given (`write_state`,
    `write_weights`). The newest `keep` checkpoints are kept, and `protect` (the best one) whatever its age."""
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
        write_manifest(staging)
    except (OSError, RuntimeError, SafetensorError) as error:  # how torch.save and save_pretrained report a full disk
        shutil.rmtree(staging, ignore_errors=True)
        kept = saved_checkpoints(run_dir)
        raise OSError(
            f"The checkpoint of step {step} could not be written ({getattr(error, 'strerror', None) or error}); "
            + (f"the previous checkpoint {kept[-1]} is intact. " if kept else "")
            + "Free some space and resume with trainer.resume=auto."
        ) from error
    shutil.rmtree(final, ignore_errors=True)  # a damaged checkpoint of this step, which the resumed run skipped
    staging.rename(final)
    for old in saved_checkpoints(run_dir)[:-keep]:
        if old != protect:
            shutil.rmtree(old)
    return final


def write_state(folder: Path, state: dict, parts: Path | None) -> None:
    """state.pt holds tensors and plain data only, which torch.load reads without unpickling code. The config goes
    beside it, to be compared at claim time without loading the tensors."""
    torch.save({key: value for key, value in state.items() if key != "config"}, folder / STATE)
    (folder / CONFIG).write_text(json.dumps(state["config"], indent=1, default=str))
    if parts is not None:  # accelerator.save_state's folder (FSDP, DeepSpeed), written by every process
        parts.rename(folder / "accelerate")


def write_weights(folder: Path, model, weights: dict, tokenizer) -> None:
    model.save_pretrained(folder / MODEL, state_dict=weights)
    tokenizer.save_pretrained(folder / MODEL)


def write_manifest(folder: Path) -> None:
    files = sorted(path for path in folder.rglob("*") if path.is_file() and path.name != MANIFEST)
    checksums = {path.relative_to(folder).as_posix(): sha256(path) for path in files}
    (folder / MANIFEST).write_text(json.dumps({"format": FORMAT, "sha256": checksums}, indent=1))


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def damage(checkpoint: Path) -> str | None:
    """Why `checkpoint` is no longer as it was written, or None when every file matches its manifest."""
    try:
        manifest = json.loads((checkpoint / MANIFEST).read_text())
        checksums = manifest["sha256"]
    except FileNotFoundError:
        return f"it has no {MANIFEST}, so its files cannot be checked (a grpo_kit older than checksums wrote it)"
    except (ValueError, KeyError, TypeError) as error:
        return f"its {MANIFEST} is unreadable ({error})"
    if not isinstance(checksums, dict) or not all(isinstance(v, str) for v in checksums.values()):
        return f"its {MANIFEST} is not a manifest: its sha256 is no table of file names and checksums"
    if not any(name == STATE or name.startswith(f"{MODEL}/") for name in checksums):
        return f"its {MANIFEST} lists neither {STATE} nor {MODEL}/: it describes no checkpoint"
    if manifest.get("format", 1) != FORMAT:
        return (
            f"an earlier grpo_kit wrote it, whose checkpoints lay out the training state otherwise (format "
            f"{manifest.get('format', 1)}; this version reads format {FORMAT}): resume it with the version that "
            "saved it"
        )
    for name, expected in checksums.items():
        if not (checkpoint / name).is_file():
            return f"{name} is missing"
        if sha256(checkpoint / name) != expected:
            return f"{name} is damaged: it no longer matches the checksum recorded when it was written"
    return None


def holds_weights_only(checkpoint: Path) -> bool:
    return (checkpoint / MODEL).is_dir() and not (checkpoint / STATE).exists()


def saved_checkpoints(run_dir: Path) -> list[Path]:
    """run_dir's checkpoints, oldest first, whether intact or not."""
    return sorted((Path(run_dir) / CHECKPOINTS).glob(f"{PREFIX}*"))


def newest_intact(run_dir: Path) -> Path | None:
    """The newest checkpoint of run_dir that matches its manifest, saying which newer ones were skipped and why."""
    for checkpoint in reversed(saved_checkpoints(run_dir)):
        reason = damage(checkpoint)
        if reason is None:
            return checkpoint
        log.warning("Skipping the checkpoint %s, which cannot be resumed from: %s", checkpoint, reason)
    return None


def find_checkpoint(resume: str, run_dir: Path) -> Path | None:
    """`auto`: the newest intact checkpoint of run_dir, or None; otherwise the checkpoint (or run directory's newest
    intact one) named, refused if it is damaged."""
    if resume == "auto":
        return newest_intact(run_dir)
    path = Path(resume)
    if (path / CHECKPOINTS).is_dir():
        path = newest_intact(path)
    elif any((path / name).exists() for name in (MANIFEST, STATE, MODEL)):  # a checkpoint, whole or not
        reason = damage(path)
        if reason is not None:
            raise InputFileError(
                f"trainer.resume={resume} cannot be resumed from: {reason}. Resume from an earlier checkpoint, or "
                "with trainer.resume=auto from its run's newest intact one."
            )
    else:
        path = None
    if path is None:
        raise InputFileError(
            f"trainer.resume={resume} is neither a checkpoint (a folder with state.pt) nor a run directory with "
            f"intact checkpoints: pass RUN_DIR/checkpoints/step-NNNNNN, a run directory, or auto."
        )
    return path


@dataclass
class Claim:
    """A run directory this process uses: the checkpoint it resumes from, the lock file's descriptor (the main
    process's alone), and whether the claim created the directory (to be removed again if the run wrote nothing)."""

    checkpoint: Path | None
    lock: int | None
    created: bool


_claims: dict[Path, Claim] = {}  # by resolved run directory


def claim_run_directory(run_dir: Path, cfg: DictConfig) -> Path | None:
    """The checkpoint this run resumes from, or None for a fresh start; refuses, having written nothing, a directory
    that another process is using, that holds a run which trained at least one step and that this run would not
    continue, or whose checkpoint was saved under other settings. The directory stays locked until
    `release_run_directory`; claiming it again in the same process (the CLI, then `train`) returns the same answer.

    What a run that failed before its first step left behind (an empty metrics.jsonl, error.txt) does not keep
    another run out: a fresh run or `trainer.resume=auto` starts there from step 0.
    """
    run_dir = Path(run_dir)
    if run_dir.resolve() in _claims:
        return _claims[run_dir.resolve()].checkpoint
    refuse_links(run_dir)
    created = not run_dir.exists()
    lock = lock_run_directory(run_dir) if is_main_process() else None  # the other processes share the main one's
    try:
        checkpoint = checkpoint_to_resume(run_dir, cfg)
    except BaseException:
        unlock_run_directory(run_dir, lock, created)
        raise
    _claims[run_dir.resolve()] = Claim(checkpoint, lock, created)
    return checkpoint


def refuse_links(run_dir: Path) -> None:
    """Refuse a run directory holding a symbolic link where the run writes (its own files, .hydra/, checkpoints and
    their contents): writing through it would truncate or overwrite whatever it points at, and rotating checkpoints
    would delete it. The directory itself may be a link (to a larger disk, say)."""
    places = [run_dir, run_dir / ".hydra", run_dir / "checkpoints", *run_dir.glob("checkpoints/*/")]
    for path in (path for place in places if place.is_dir() for path in sorted(place.iterdir())):
        if path.is_symlink():  # found before any place under it is read: a link is never followed here
            raise InputFileError(
                f"{path} is a symbolic link (to {os.readlink(path)}): a run writes into its directory and follows no "
                "link there, which could overwrite or delete the file it points at. Remove the link, or choose "
                "another hydra.run.dir."
            )


def release_run_directory(run_dir: Path) -> None:
    """End this process's claim on run_dir, which `train` does however the run ends."""
    claim = _claims.pop(Path(run_dir).resolve(), None)
    if claim is not None:
        unlock_run_directory(Path(run_dir), claim.lock, claim.created)


def lock_run_directory(run_dir: Path) -> int:
    """An exclusive lock on RUN_DIR/.lock, which holds this process's pid; the OS releases it when the process dies,
    however it dies. Refuses a directory that another process has locked, naming that process."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK
    while True:
        lock = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)  # a link made meanwhile: ELOOP
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock)
            raise ConfigError(
                f"{run_dir} is in use by another run (pid {lock_holder(path)}, which holds {path}): two runs in one "
                "directory would overwrite each other's checkpoints and metrics. Wait for that run to end, or train "
                "into another directory with hydra.run.dir=..."
            ) from None
        if same_file(lock, path):  # not a lock file that its last holder removed while this process opened it
            break
        os.close(lock)
    os.ftruncate(lock, 0)
    os.write(lock, f"{os.getpid()}\n".encode())
    return lock


def unlock_run_directory(run_dir: Path, lock: int | None, created: bool) -> None:
    """Release the lock; a directory that the claim created and a refused run left empty goes too."""
    if lock is not None:
        (run_dir / LOCK).unlink(missing_ok=True)  # before the lock is released, so no other run's file is removed
        os.close(lock)
        if created:
            with contextlib.suppress(OSError):  # not empty: the run wrote into it
                run_dir.rmdir()


def lock_holder(path: Path) -> str:
    try:
        return path.read_text().strip() or "unknown"
    except FileNotFoundError:  # released meanwhile
        return "unknown"


def same_file(descriptor: int, path: Path) -> bool:
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(descriptor)
    return (held.st_dev, held.st_ino) == (found.st_dev, found.st_ino)


def checkpoint_to_resume(run_dir: Path, cfg: DictConfig) -> Path | None:
    resume = cfg.trainer.resume
    checkpoint = find_checkpoint(resume, run_dir) if resume else None
    if checkpoint is not None and holds_weights_only(checkpoint):
        raise ConfigError(
            f"{checkpoint} holds the model's weights only (trainer.save_only_model=true): no optimizer, schedule, "
            "random generators or data position, so no run can go on from it exactly. Train into another "
            f"directory from these weights with model.name_or_path={checkpoint / MODEL}, or resume from a whole "
            "checkpoint (trainer.save_only_model=false writes them)."
        )
    if checkpoint is not None:
        check_resumable(saved_config(checkpoint), cfg, checkpoint)
        return checkpoint
    trained = trained_steps(run_dir)
    if trained and resume:
        why = (
            "none of its checkpoints is intact (the warnings above say why)"
            if saved_checkpoints(run_dir)
            else "no checkpoint to resume from (trainer.save_steps was 0, or the run stopped before its first save)"
        )
        raise ConfigError(
            f"{run_dir} holds a run that trained {trained} step(s) but {why}. It is left untouched: train into "
            "another directory with hydra.run.dir=..."
        )
    if trained:
        continuing = (
            "continue it from its last checkpoint with trainer.resume=auto, or " if saved_checkpoints(run_dir) else ""
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
    # Unresolved: an override '${oc.env:KEY}' is given again as it was, not as its value.
    overrides = (
        OmegaConf.to_container(OmegaConf.load(overrides_file), resolve=False) if overrides_file.is_file() else []
    )
    kept = [o for o in overrides if not o.startswith(("trainer.resume=", "hydra.run.dir=", "hydra.sweep.dir="))]
    secrets = [o.partition("=")[0].lstrip("+~") for o in kept if o.endswith(f"={REDACTED}")]
    kept = [o for o in kept if not o.endswith(f"={REDACTED}")]
    words = ["python", "-m", "grpo_kit", *kept, "trainer.resume=auto", f"hydra.run.dir={run_dir.resolve()}"]
    command = " ".join(shlex.quote(word) for word in words)
    if secrets:  # given literally, so recorded nowhere: the user gives them again
        command += f"  (and your {', '.join(secrets)}, which no file records: add it, best as '${{oc.env:NAME}}')"
    return command


def load_checkpoint(path: Path) -> dict:
    """state.pt as `write_state` saved it (without the config: `saved_config`)."""
    try:  # tensors and plain data only: unpickling anything else could run code the file carries
        return torch.load(Path(path) / STATE, weights_only=True)
    except pickle.UnpicklingError as error:
        raise InputFileError(
            f"{Path(path) / STATE} holds more than tensors and plain data, so it was not loaded (loading it could run "
            f"code it carries): resume only from checkpoints a grpo_kit run saved. torch says: {error}"
        ) from None


def saved_config(checkpoint: Path) -> dict:
    return json.loads((checkpoint / CONFIG).read_text())


def restore_run_files(checkpoint: Path, run_dir: Path) -> None:
    """metrics.jsonl and samples.jsonl as they were at the checkpoint: later lines belong to lost steps."""
    for name in ("metrics.jsonl", "samples.jsonl"):
        if (checkpoint / name).exists():
            shutil.copy2(checkpoint / name, Path(run_dir) / name)
        else:
            (Path(run_dir) / name).unlink(missing_ok=True)


# Settings that may change between a run and its resumption without changing what it computes.
RESUMABLE_CHANGES = {
    "trainer.resume",
    "trainer.resume_force",
    "trainer.progress_bar",
    "model.logits",
    "model.logits_chunk_size",
    "model.logits_vocab_tile",
    "model.mask_free_passes",
    "model.passes_by_length",
    "model.cpu_chunked_attention",
    "model.pad_to_multiple_of",
    # Where the run is pushed to (docs/hub.md): the Hub's copy, not the training
    "trainer.push_to_hub",
    "trainer.hub_model_id",
    "trainer.hub_strategy",
    "trainer.hub_private_repo",
    "trainer.hub_token",
    "trainer.hub_revision",
    "trainer.hub_always_push",
}


def check_resumable(saved: dict, cfg: DictConfig, checkpoint: Path) -> None:
    """Refuse to resume under other settings (unless trainer.resume_force): the result would be neither run."""
    changed = [
        f"{key}: {before!r} -> {after!r}" + _why_it_matters(key, cfg)
        for key, before, after in _differences(under_current_names(saved), as_json(redacted(cfg)))
        if key not in RESUMABLE_CHANGES and not (key in LENGTH_SETTINGS and _schedule_is_constant(cfg))
    ]
    if changed and not cfg.trainer.resume_force:
        raise ConfigError(
            f"{checkpoint} was saved with other settings:\n  "
            + "\n  ".join(changed)
            + "\nResume with the same settings, or add trainer.resume_force=true to go on with the new ones."
        )
    if changed:
        log.warning("Resuming %s with changed settings:\n  %s", checkpoint, "\n  ".join(changed))


def as_json(config: dict) -> dict:
    """The config as config.json holds it (lists for tuples, strings for paths), to compare like with like."""
    return json.loads(json.dumps(config, default=str))


# The run's length: the learning-rate schedule is laid out over it, so a new length bends the schedule mid-way.
LENGTH_SETTINGS = {"trainer.max_steps", "trainer.num_train_epochs"}


def _schedule_is_constant(cfg: DictConfig) -> bool:
    return cfg.trainer.lr_scheduler_type == "constant"  # which takes no warmup (grpo_kit/training/optimizers.py)


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
    """Every random generator's state, as tensors and plain data: numpy's key as a list, not an array, which
    torch.load(weights_only=True) would refuse."""
    kind, key, *rest = np.random.get_state()
    states = {"python": random.getstate(), "numpy": (kind, key.tolist(), *rest), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_random_states(states: dict) -> None:
    random.setstate(states["python"])
    kind, key, *rest = states["numpy"]
    np.random.set_state((kind, np.array(key, dtype=np.uint32), *rest))
    torch.set_rng_state(states["torch"])
    if "cuda" in states:
        torch.cuda.set_rng_state_all(states["cuda"])
