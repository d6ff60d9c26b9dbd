"""A TRL or open-r1 recipe (the YAML of `trl grpo --config`) as grpo_kit overrides.

Every field goes through its entry (grpo_kit/config/trl_fields.py, trl_script_fields.py): mapped into overrides,
refused with the reason and the nearest grpo_kit option, or not applicable with why. The refusals are collected, so
that a recipe's whole list is reported at once; a recipe with any is not translated. No field passes unreported.
"""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from grpo_kit.config.trl_entries import NO_INERT, Mapped, NotApplicable, Refusal, Refused
from grpo_kit.config.trl_fields import GRPO_CONFIG_FIELDS
from grpo_kit.config.trl_script_fields import SCRIPT
from grpo_kit.contract.errors import ConfigError

ALL_FIELDS = {**GRPO_CONFIG_FIELDS, **SCRIPT}
# Overrides that choose a plugin or a preset rather than set a value.
CHOICES = ("model", "data", "loss", "importance_sampling", "rollout_correction", "advantage", "generation", "reward")


@dataclass
class Translation:
    overrides: dict[str, Any] = field(default_factory=dict)  # path or plugin kind -> value, in the recipe's order
    refusals: list[tuple[str, str, str]] = field(default_factory=list)  # (field, reason, nearest grpo_kit option)
    notes: list[tuple[str, str]] = field(default_factory=list)  # (field, why it does nothing here)

    def refused_text(self) -> str:
        lines = [f"  {name}: {reason}. Nearest in grpo_kit: {nearest}" for name, reason, nearest in self.refusals]
        return f"{len(self.refusals)} field(s) of the recipe cannot be carried over:\n" + "\n".join(lines)

    def notes_text(self) -> str:
        return "\n".join(f"  {name}: {why}" for name, why in self.notes)


def read_recipe(path: str | Path) -> dict:
    try:
        recipe = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as error:
        raise ConfigError(f"cannot read the TRL recipe {path}: {error}") from None
    if not isinstance(recipe, dict):
        raise ConfigError(f"the TRL recipe {path} is not a mapping of fields to values")
    return recipe


def translate(recipe: dict) -> Translation:
    result = Translation()
    for name, value in recipe.items():
        entry = ALL_FIELDS.get(name)
        if entry is None:
            result.refusals.append((name, "not a field of TRL 1.16's GRPOConfig, its scripts' or open-r1's", "none"))
        elif isinstance(entry, NotApplicable):
            result.notes.append((name, entry.why))
        elif isinstance(entry, Refused):
            if entry.inert is not NO_INERT and value == entry.inert:
                result.notes.append((name, f"{value!r} is TRL's default, which asks for nothing"))
            else:
                result.refusals.append((name, entry.reason, entry.nearest))
        else:
            add_mapped(result, name, entry, value, recipe)
    return result


def add_mapped(result: Translation, name: str, entry: Mapped, value, recipe: dict) -> None:
    try:
        overrides = entry.overrides(value, recipe)
    except Refusal as refusal:
        result.refusals.append((name, refusal.reason, refusal.nearest))
        return
    if not overrides:
        result.notes.append((name, f"{value!r} sets nothing beyond what the other fields set ({entry.key})"))
    for key, new in overrides.items():
        old = result.overrides.get(key, new)
        if isinstance(old, dict) and isinstance(new, dict):
            new = {**old, **new}  # model_init_kwargs, dtype and attn_implementation make one dict
        elif old != new:
            result.refusals.append((name, f"sets {key}={new!r}, where another field set {old!r}", key))
            continue
        result.overrides[key] = new


def recipe_overrides(path: str | Path) -> Translation:
    """The recipe at `path`, translated; ConfigError with every refusal when any field cannot be carried over."""
    translation = translate(read_recipe(path))
    if translation.refusals:
        raise ConfigError(f"{path}: {translation.refused_text()}")
    return translation
