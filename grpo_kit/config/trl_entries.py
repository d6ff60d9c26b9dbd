"""What one field of a TRL recipe becomes in grpo_kit: mapped, refused, or not applicable. The tables of
grpo_kit/config/trl_fields.py and grpo_kit/config/trl_script_fields.py are made of these; `grpo-kit from-trl`
(grpo_kit/cli/from_trl.py) reads a recipe through them.

A field that no entry names is refused as unknown, never dropped: a recipe that says something grpo_kit does not
understand must not train as if it had not said it.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# An entry's `inert` value when it has none: a field set to its inert value asks TRL for nothing (its default).
NO_INERT = object()

# A translation reads the field's value and the whole recipe (some fields mean something only beside others) and
# returns the overrides, path -> value; "loss", "advantage" and the other plugin kinds take a plugin's name.
Translate = Callable[[Any, dict], dict[str, Any]]


class Refusal(Exception):
    """Raised by a translation for a value it cannot carry over (the field maps, this value does not)."""

    def __init__(self, reason: str, nearest: str):
        super().__init__(reason)
        self.reason = reason
        self.nearest = nearest


@dataclass(frozen=True)
class Mapped:
    """The field becomes `key` (the same value), or whatever `translate` makes of it."""

    key: str
    translate: Translate | None = None
    note: str = ""  # where grpo_kit's meaning differs, said in the docs table

    def overrides(self, value, recipe: dict) -> dict[str, Any]:
        return self.translate(value, recipe) if self.translate else {self.key: value}


@dataclass(frozen=True)
class Refused:
    """grpo_kit has no such setting: a recipe that sets it is refused, naming the nearest grpo_kit option. At
    `inert` (TRL's default, where the field asks for nothing) it is accepted, since nothing is lost."""

    reason: str
    nearest: str
    inert: Any = NO_INERT


@dataclass(frozen=True)
class NotApplicable:
    """The field has no meaning in grpo_kit, whatever its value: a recipe may keep it, and is told why it does
    nothing here."""

    why: str


Entry = Mapped | Refused | NotApplicable


def same(key: str, note: str = "") -> Mapped:
    return Mapped(key, note=note)


def kind(entry: Entry) -> str:
    return {Mapped: "mapped", Refused: "refused", NotApplicable: "not applicable"}[type(entry)]
