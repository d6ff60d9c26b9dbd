"""The reproducibility lock: which plugin distributions, versions and entry points a run was made with.

Every run directory gets `plugins.lock.json`: the sessions that trained the run's steps, each with the step it
started from and its lock. A resumed session whose lock differs from the last one's is warned about, with what
differs, and added; an attempt whose steps are not kept (it failed before its first checkpoint, and the run goes
on from an earlier step) is replaced. So the file says what trained the steps the run holds, and a result is never
silently reproduced with other code.
"""

import hashlib
import importlib.metadata
import json
import logging
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from grpo_kit.config.secrets import redacted
from grpo_kit.outputs.checkpoints import RESUMABLE_CHANGES
from grpo_kit.plugins.registry import ENTRY_POINT_GROUP, Registry

log = logging.getLogger(__name__)
LOCK_FILE = "plugins.lock.json"


def current_lock(registry: Registry, cfg: DictConfig | None = None) -> dict:
    core = importlib.metadata.distribution("grpo-kit")
    lock = {
        "core": f"grpo-kit {core.version}",
        "entry_points": {
            ep.name: {"value": ep.value, "distribution": f"{ep.dist.name} {ep.dist.version}" if ep.dist else "unknown"}
            for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
        },
        "plugins": {
            f"{plugin.kind}/{plugin.name}": plugin.distribution
            for kind in registry.kinds()
            for plugin in registry.plugins(kind)
        },
    }
    if cfg is not None:
        lock["config_sha256"] = config_sha256(cfg)
    return lock


def config_sha256(cfg: DictConfig) -> str:
    """The resolved config's hash, without the settings that a resumed run may change (trainer.resume, ...)
    without changing what it computes."""
    resolved = redacted(cfg)  # a new API key changes nothing computed
    for key in RESUMABLE_CHANGES:
        section, name = key.split(".")
        resolved[section].pop(name, None)
    return hashlib.sha256(OmegaConf.to_yaml(OmegaConf.create(resolved), sort_keys=True).encode()).hexdigest()


def differences(recorded: dict, current: dict) -> list[str]:
    """Human-readable lines for everything that differs between two locks."""
    lines = []
    if recorded.get("core") != current.get("core"):
        lines.append(f"core: {recorded.get('core')} -> {current.get('core')}")
    for section in ("entry_points", "plugins"):
        before, after = recorded.get(section, {}), current.get(section, {})
        for key in sorted(before.keys() | after.keys()):
            if before.get(key) != after.get(key):
                lines.append(f"{section} {key}: {_show(before.get(key))} -> {_show(after.get(key))}")
    if (
        "config_sha256" in recorded
        and "config_sha256" in current
        and recorded["config_sha256"] != current["config_sha256"]
    ):
        lines.append("the resolved config differs (config_sha256)")
    return lines


def record_session(run_dir: Path, registry: Registry, cfg: DictConfig, start_step: int) -> None:
    """Record in `run_dir`'s lock the session that trains from `start_step` (0, or the checkpoint's step it
    resumes from); warn with what changed since the session that trained the steps before."""
    path = Path(run_dir) / LOCK_FILE
    current = current_lock(registry, cfg)
    # Sessions that started at this step or later trained nothing the run keeps.
    sessions = [session for session in _sessions(path) if session["from_step"] < start_step]
    changed = differences(sessions[-1], current) if sessions else []
    if changed:
        log.warning(
            "The steps up to %d of this run were trained with other plugins or settings than now; %s records "
            "both:\n  %s",
            start_step,
            LOCK_FILE,
            "\n  ".join(changed),
        )
    if changed or not sessions:
        sessions.append({"from_step": start_step, **current})
    path.write_text(json.dumps({"sessions": sessions}, indent=2, sort_keys=True) + "\n")


def _sessions(path: Path) -> list[dict]:
    if not path.exists():
        return []
    recorded = json.loads(path.read_text())
    return recorded.get("sessions") or [{"from_step": 0, **recorded}]  # a lock of one session, as it once was


def _show(value) -> str:
    if value is None:
        return "(absent)"
    return value if isinstance(value, str) else f"{value['value']} from {value['distribution']}"
