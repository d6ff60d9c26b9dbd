"""A run's config as files and logs may hold it: every secret option's value (contract/secrets.py) replaced.

The options are found through the dataclasses that composed the config, so a plugin's secrets are known without
a list here. An override whose value is an interpolation (`'${oc.env:OPENAI_API_KEY}'`) holds no secret and is
kept as it is, so that the recorded command and the resume command still work.
"""

import dataclasses
import logging
import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from grpo_kit.config.schema import RunConfig
from grpo_kit.contract.secrets import is_secret
from grpo_kit.plugins.registry import Registry

REDACTED = "<secret>"


def secret_paths(cfg: DictConfig) -> set[str]:
    """The dotted keys of `cfg`'s secret options, as its structured nodes' dataclasses declare them."""
    paths = set()

    def visit(node: DictConfig, prefix: str) -> None:
        kind = OmegaConf.get_type(node)
        if dataclasses.is_dataclass(kind):
            paths.update(f"{prefix}{f.name}" for f in dataclasses.fields(kind) if is_secret(f))
        for key in node.keys():
            child = node._get_node(key)
            if isinstance(child, DictConfig) and not child._is_none():
                visit(child, f"{prefix}{key}.")

    visit(cfg, "")
    return paths


def redacted(cfg: DictConfig, resolve: bool = True) -> dict:
    """`cfg` as a plain container with every secret option that is set replaced; `resolve=False` keeps
    interpolations, which hold no secret."""
    return _replaced(OmegaConf.to_container(cfg, resolve=resolve), secret_paths(cfg), keep_interpolations=not resolve)


def _replaced(container: dict, paths: set[str], keep_interpolations: bool) -> dict:
    """`container` with the value at each dotted path in `paths` that is set replaced by REDACTED."""
    for path in paths:
        *parents, name = path.split(".")
        node = container
        for parent in parents:
            node = node.get(parent) if isinstance(node, dict) else None
        if isinstance(node, dict) and node.get(name) is not None:
            if not (keep_interpolations and _is_interpolation(node[name])):
                node[name] = REDACTED
    return container


def redacted_overrides(overrides: list[str], paths: set[str]) -> list[str]:
    """Command-line overrides with the value of each secret option given literally replaced."""
    return [_redacted_override(override, paths) for override in overrides]


def _redacted_override(override: str, paths: set[str]) -> str:
    key, separator, value = override.partition("=")
    if separator and key.lstrip("+~") in paths and not _is_interpolation(value.strip("'\"")):
        return f"{key}={REDACTED}"
    return override


def _is_interpolation(value) -> bool:
    """`${oc.env:NAME}`, or as a sweep's job gets it, escaped: `$\\{oc.env\\:NAME\\}`."""
    value = value.replace("\\", "") if isinstance(value, str) else value
    return isinstance(value, str) and value.startswith("${") and value.endswith("}")


def redacted_hydra_record(record: dict, paths: set[str]) -> dict:
    """Hydra's record of a job (HydraConfig, as a container) with the secrets its command line gave replaced."""
    overrides, job = record.get("overrides") or {}, record.get("job") or {}
    if overrides.get("task"):
        overrides["task"] = redacted_overrides(overrides["task"], paths)
    if job.get("override_dirname"):
        job["override_dirname"] = ",".join(redacted_overrides(job["override_dirname"].split(","), paths))
    return record


def redact_sweep_record(path: Path, paths: set[str]) -> None:
    """multirun.yaml, which Hydra's sweeper writes into the sweep's folder before any run starts: its command line
    and its config, with the secrets given literally replaced (interpolations kept: they hold none)."""
    if not paths or not path.is_file():
        return
    record = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    redacted_hydra_record(record.get("hydra") or {}, paths)
    _replaced(record, paths, keep_interpolations=True)
    written = path.with_name(f".{path.name}.{os.getpid()}")  # the sweep's runs may do this at once
    OmegaConf.save(OmegaConf.create(record), written)
    os.replace(written, path)


def literal_secrets(overrides: list[str], registry: Registry) -> set[str]:
    """The values of the command line's overrides that name a secret option of the core (trainer.hub_token) or of an
    installed plugin literally (not as an interpolation): known before Hydra composes the run, and logs it."""
    core = declared_secret_paths(RunConfig)
    names = {
        field.name
        for kind in registry.kinds()
        for plugin in registry.plugins(kind)
        if dataclasses.is_dataclass(plugin.config)
        for field in dataclasses.fields(plugin.config)
        if is_secret(field)
    }
    values = set()
    for override in overrides:
        key, _, value = override.partition("=")
        value = value.strip("'\"")
        known = key.lstrip("+~") in core or key.rsplit(".", 1)[-1] in names
        if known and value and not _is_interpolation(value):
            values.add(value)
    return values


def declared_secret_paths(kind: type, prefix: str = "") -> set[str]:
    """The dotted keys of the secret options a config dataclass declares, in it and in the dataclasses it nests."""
    paths = set()
    for field in dataclasses.fields(kind):
        if is_secret(field):
            paths.add(f"{prefix}{field.name}")
        elif isinstance(field.type, type) and dataclasses.is_dataclass(field.type):
            paths |= declared_secret_paths(field.type, f"{prefix}{field.name}.")
    return paths


def redact_logs(values: set[str]) -> None:
    """Replace `values` in every log record from now on, whoever logs it: Hydra's launchers log each job's
    command line before any run starts."""
    make_record = logging.getLogRecordFactory()

    def redacting(*args, **kwargs) -> logging.LogRecord:
        record = make_record(*args, **kwargs)
        message = record.getMessage()
        if any(value in message for value in values):
            for value in values:
                message = message.replace(value, REDACTED)
            record.msg, record.args = message, None
        return record

    logging.setLogRecordFactory(redacting)
