"""A run's config as files and logs may hold it: every secret option's value (contract/secrets.py) replaced.

The options are found through the dataclasses that composed the config, so a plugin's secrets are known without
a list here. An override whose value is an interpolation (`'${oc.env:OPENAI_API_KEY}'`) holds no secret and is
kept as it is, so that the recorded command and the resume command still work.
"""

import dataclasses

from omegaconf import DictConfig, OmegaConf

from grpo_kit.contract.secrets import is_secret

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
    container = OmegaConf.to_container(cfg, resolve=resolve)
    for path in secret_paths(cfg):
        *parents, name = path.split(".")
        node = container
        for parent in parents:
            node = node[parent]
        if node.get(name) is not None and not (not resolve and _is_interpolation(node[name])):
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
    return isinstance(value, str) and value.startswith("${") and value.endswith("}")
