"""A translated recipe (grpo_kit/config/trl_recipe.py) written out: as Hydra overrides for the command line, and
as an experiment file in conf/experiment's style. Both compose the same run (tests/test_from_trl.py)."""

import json
import re
from typing import Any

import yaml

from grpo_kit.config.presets import PRESET_FOR_PATH as PRESETS
from grpo_kit.config.trl_recipe import CHOICES

_PLAIN = re.compile(r"^[A-Za-z_/][\w.\-/:]*$")  # what Hydra reads as a string without quotes


def hydra_value(value: Any) -> str:
    """A value in Hydra's override grammar: null, true, 1e-06, cosine, "two words", [a,b], {k:v}."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{key}:{hydra_value(item)}" for key, item in value.items()) + "}"
    text = str(value)
    return text if _PLAIN.match(text) and text not in ("null", "true", "false") else json.dumps(text)


def reward_overrides(rewards: dict[str, str]) -> list[str]:
    """`+reward=[a,b]` for rewards under their plugin's name, `+reward@reward.KEY=PLUGIN` for the others."""
    plain = [key for key, plugin in rewards.items() if key == plugin]
    named = [f"+reward@reward.{key}={plugin}" for key, plugin in rewards.items() if key != plugin]
    if len(plain) == 1:
        return [f"+reward={plain[0]}", *named]
    return ([f"+reward=[{','.join(plain)}]"] if plain else []) + named


def hydra_overrides(overrides: dict[str, Any]) -> list[str]:
    """Plugin choices first, then values: Hydra applies a choice before the values that set its options."""
    choices = [f"{key}={value}" for key, value in overrides.items() if key in CHOICES and key != "reward"]
    rewards = reward_overrides(overrides.get("reward", {}))
    values = [f"{key}={hydra_value(value)}" for key, value in overrides.items() if key not in CHOICES]
    return choices + rewards + values


def experiment_yaml(overrides: dict[str, Any], header: list[str]) -> str:
    """An experiment file: `header` as its opening comments (the command first), the choices as its defaults list,
    the values nested under their sections."""
    defaults: list = [{f"override /{group}": preset} for key, (group, preset) in PRESETS.items() if key in overrides]
    defaults += [{f"/reward@reward.{key}": plugin} for key, plugin in overrides.get("reward", {}).items()]
    defaults += [{f"override /{key}": value} for key, value in overrides.items() if key in CHOICES and key != "reward"]
    values: dict = {}
    for key, value in overrides.items():
        if key in CHOICES:
            continue
        *parents, name = key.split(".")
        holder = values
        for parent in parents:
            holder = holder.setdefault(parent, {})
        holder[name] = value
    body = yaml.safe_dump({"defaults": [*defaults, "_self_"], **values}, sort_keys=False, allow_unicode=True)
    return "\n".join(["# @package _global_", *(f"# {line}" for line in header), body])
