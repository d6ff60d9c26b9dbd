"""The command line's overrides, checked before Hydra composes them: a key that nothing would read (a misspelt
section or option, with the closest ones), a plugin that is not installed, a run that names no reward. Hydra would
take a misspelt key with `+` as a new one, and compose a run without a reward.
"""

import dataclasses
import difflib
import re
import typing

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override

from grpo_kit.config.presets import PRESET_FOR_PATH, preset_groups
from grpo_kit.config.schema import (
    DEFAULT_CHOICES,
    RENAMED_OPTIONS,
    SHADOW_GRADIENT_EVERY,
    GradientDiagnosticsConfig,
    RunConfig,
    named_plugin_config,
)
from grpo_kit.contract.errors import ConfigError, PluginError
from grpo_kit.contract.kinds import KINDS, MULTI_CHOICE_KINDS
from grpo_kit.plugins.registry import Registry


def check_choices(overrides: list[str] | tuple[str, ...], registry: Registry) -> None:
    """Fail on an unknown key, or on a plugin name that is not installed (with the installed choices), before
    anything is composed."""
    parsed = OverridesParser.create().parse_overrides(list(overrides))
    check_renamed(parsed)
    check_top_level_keys(parsed)
    for override in parsed:
        kind = PLUGIN_GROUPS.get(override.key_or_group)
        if kind is not None and not override.is_delete():
            for name in chosen_names(override):
                registry.get(kind, name)
    check_option_keys(parsed, registry)


def check_renamed(overrides: list[Override]) -> None:
    """Fail on an option that has a new name, saying it."""
    for override in overrides:
        key = override.key_or_group
        for old, new in RENAMED_OPTIONS.items():
            if key == old or key.startswith(old + "."):
                raise ConfigError(
                    f"{override.input_line}: {old} is now called {new}; write {new + key[len(old) :]} instead."
                )


def check_top_level_keys(overrides: list[Override]) -> None:
    """Fail on an override whose first key is none of the run's sections, plugin kinds, preset groups or `hydra`:
    Hydra would add it as a new key that nothing reads (`+hooks=dynamic_sampling` for `+hook=...`)."""
    valid = top_level_keys()
    for override in overrides:
        keys = [override.key_or_group] + ([override.package] if override.package else [])
        for unknown in [key for key in keys if _first_key(key) not in valid and not key.startswith("_")]:
            close = difflib.get_close_matches(_first_key(unknown), valid, n=1)
            hint = f"Did you mean {close[0]!r}? " if close else ""
            raise ConfigError(
                f"{override.input_line}: {_first_key(unknown)!r} is not a setting of a grpo_kit run, so nothing would "
                f"read it. {hint}The top-level keys are: {', '.join(valid)}. `python -m grpo_kit --cfg job` shows the "
                "whole config, `grpo-kit plugins` every plugin option."
            )


def check_option_keys(overrides: list[Override], registry: Registry) -> None:
    """Fail on a misspelt option of a section or a plugin (`trainer.max_step=10`, `+loss.alpah=0.5`), naming the
    closest ones: Hydra would advise `+` for it, and would take it with `+` as a new key that nothing reads.

    Keys are checked down to the first option that is no dataclass: below it they are free
    (`data.chat_template_kwargs.enable_thinking`), or Hydra checks them itself.
    """
    for override in overrides:
        key = override.key_or_group
        first, *rest = key.split(".")
        if override.is_delete() or override.package or not rest or "/" in key or first not in OPTION_ROOTS:
            continue
        prefix = owner = first  # owner: what the message calls the options' owner ("loss dapo")
        if first == "shadow" and rest == [SHADOW_GRADIENT_EVERY]:
            continue
        if first in PLACED_GROUPS:  # reward.NAME.OPTION, shadow.NAME.OPTION
            places = multi_choice_places(first, overrides, registry)
            place, *rest = rest
            if place not in places:
                what = "shadow loss" if first == "shadow" else first
                _refuse(override, place, first, f"no {what} the run can select is named {place!r}", places)
            classes, prefix = places[place], f"{first}.{place}"
            owner = prefix
        elif first in KINDS:
            names = plugins_chosen(first, overrides, registry)
            classes, owner = [_plugin_config(registry, first, name) for name in names], f"{first} {'/'.join(names)}"
        else:
            classes = [OPTION_ROOTS[first]]
        for part in rest:
            types = _field_types(classes)
            if part not in types:
                _refuse(override, part, prefix, f"{part!r} is not an option of {owner}", types)
            classes = [kind for kind in types[part] if dataclasses.is_dataclass(kind)]
            if not classes:
                break
            prefix = owner = f"{prefix}.{part}"


# The groups whose choices are plugins, with their kind: each kind's own, and `shadow`, whose choices are losses.
PLUGIN_GROUPS = {**{kind: kind for kind in KINDS}, "shadow": "loss"}
# The groups whose choices each sit at GROUP.NAME, several at once.
PLACED_GROUPS = (*MULTI_CHOICE_KINDS, "shadow")

# The first keys whose options are checked: the sections that are dataclasses, every plugin kind, the instruments.
OPTION_ROOTS = {
    **{field_.name: field_.type for field_ in dataclasses.fields(RunConfig) if dataclasses.is_dataclass(field_.type)},
    **dict.fromkeys(PLUGIN_GROUPS),
    "diagnostics": GradientDiagnosticsConfig,
}


def plugins_chosen(kind: str, overrides: list[Override], registry: Registry) -> list[str]:
    """The plugins of a single-choice kind that `overrides` may select: the one they name, else the default one
    when no preset may choose another (model=hf, +experiment=dapo), else every installed one."""
    named = [
        name
        for override in overrides
        if override.key_or_group == kind and not override.is_delete()
        for name in chosen_names(override)
    ]
    if named:
        return named
    if DEFAULT_CHOICES.get(kind) in registry.names(kind) and not any(map(_may_choose_plugins, overrides)):
        return [DEFAULT_CHOICES[kind]]
    return registry.names(kind)


def multi_choice_places(group: str, overrides: list[Override], registry: Registry) -> dict[str, list[type]]:
    """Where a reward, hook or shadow loss may sit (reward.NAME), with its plugin's config: each installed plugin at
    its own name, and each one placed elsewhere (`+reward@reward.brevity=python`)."""
    kind = PLUGIN_GROUPS[group]
    places = {name: [_plugin_config(registry, kind, name)] for name in registry.names(kind)}
    for override in overrides:
        if override.key_or_group == group and (override.package or "").startswith(f"{group}."):
            places[override.package.split(".")[1]] = [
                _plugin_config(registry, kind, name) for name in chosen_names(override)
            ]
    return places


def _may_choose_plugins(override: Override) -> bool:
    """A preset choice (model=hf, +experiment=dapo, +sweep/losses=grpo), or a model or dataset path, which
    chooses a preset."""
    key = override.key_or_group
    return key in PRESET_FOR_PATH or ("." not in key and _first_key(key) in preset_groups())


def chosen_names(override: Override) -> list[str]:
    """The names an override chooses: one (`+loss=dapo`), a list (`+reward=[a,b]`) or a sweep's (`+loss=grpo,dapo`)."""
    if override.is_sweep_override():
        return [str(name) for name in override.sweep_string_iterator()]
    value = override.value()
    return [str(name) for name in (value if isinstance(value, list) else [value])]


def _plugin_config(registry: Registry, kind: str, name: str) -> type:
    return named_plugin_config(registry.get(kind, name).config, name)


def _field_types(classes: list[type]) -> dict[str, list]:
    """Each field name of `classes` (dataclasses), with the types it has in them."""
    types: dict[str, list] = {}
    for cls in classes:
        hints = typing.get_type_hints(cls)
        for field_ in dataclasses.fields(cls):
            types.setdefault(field_.name, []).append(hints[field_.name])
    return types


def _refuse(override: Override, unknown: str, prefix: str, problem: str, valid) -> None:
    close = difflib.get_close_matches(unknown, list(valid), n=3, cutoff=0.6)
    hint = f"Did you mean {' or '.join(repr(f'{prefix}.{key}') for key in close)}? " if close else ""
    raise ConfigError(
        f"{override.input_line}: {problem}, so nothing would read it. {hint}The options of {prefix}: "
        f"{', '.join(sorted(valid))}. `python -m grpo_kit --cfg job` shows the whole config, `grpo-kit plugins` "
        "every plugin option."
    )


def top_level_keys() -> list[str]:
    """The run config's sections, Hydra's own key, and the preset groups in conf/ (experiment, sweep, ...)."""
    sections = [f.name for f in dataclasses.fields(RunConfig)]
    return sorted({*sections, "hydra", *preset_groups()})


def _first_key(key: str) -> str:
    return re.split(r"[./]", key, maxsplit=1)[0]


def check_a_reward_may_be_chosen(overrides: list[str] | tuple[str, ...], registry: Registry) -> None:
    """Refuse a run whose overrides name no reward where no preset or Hydra setting may add one, before Hydra
    composes it: a forgotten +reward then answers as fast as a misspelt key."""
    parsed = OverridesParser.create().parse_overrides(list(overrides))
    if not any(_may_add_a_reward(override.key_or_group) for override in parsed):
        raise no_reward(registry)


def _may_add_a_reward(key: str) -> bool:
    """`reward...`, a preset choice (`+experiment=dapo` adds one), or a sweeper's (`hydra.sweeper.params`)."""
    first = _first_key(key)
    return (
        first == "reward"
        or key.startswith(("hydra.sweeper", "hydra/sweeper"))
        or (first in preset_groups() and "." not in key)
    )


def no_reward(registry: Registry) -> PluginError:
    return PluginError(f"No reward selected: add +reward=NAME (installed: {', '.join(registry.names('reward'))}).")
