"""The reproducibility lock: which plugin distributions, versions and entry points a run was made with.

Every run directory gets `plugins.lock.json`. Training again into a directory that holds one (a resumed run), or
checking a run against this environment (`grpo-kit lock RUN_DIR`), lists what differs, so that a result is never
silently reproduced with other code.
"""

import hashlib
import importlib.metadata
import json
import logging
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from grpo_kit.plugins import ENTRY_POINT_GROUP, Registry

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
        resolved = OmegaConf.to_yaml(cfg, resolve=True, sort_keys=True)
        lock["config_sha256"] = hashlib.sha256(resolved.encode()).hexdigest()
    return lock


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
    if "config_sha256" in recorded and "config_sha256" in current and recorded["config_sha256"] != current["config_sha256"]:
        lines.append("the resolved config differs (config_sha256)")
    return lines


def write_or_compare(run_dir: Path, registry: Registry, cfg: DictConfig) -> None:
    """Record the lock in `run_dir`; if one is there already, warn with what changed since."""
    path = Path(run_dir) / LOCK_FILE
    current = current_lock(registry, cfg)
    if path.exists():
        changed = differences(json.loads(path.read_text()), current)
        if changed:
            log.warning("This run was made with other plugins or settings than now:\n  %s", "\n  ".join(changed))
        return
    path.write_text(json.dumps(current, indent=2, sort_keys=True) + "\n")


def _show(value) -> str:
    if value is None:
        return "(absent)"
    return value if isinstance(value, str) else f"{value['value']} from {value['distribution']}"
