"""Options that hold secrets (API keys, tokens): a plugin declares them on its config dataclass with `secret()`,
and grpo_kit writes their values to no file and no log (config.yaml, .hydra/, checkpoints, trackers, reports,
the resume command): grpo_kit/config/secrets.py replaces them there."""

from dataclasses import Field, field
from typing import Any

SECRET = "grpo_kit.secret"  # the dataclass field's metadata key


def secret(default: Any = None) -> Any:
    """A config field whose value is a secret: `api_key: str | None = secret()`. Pass it as an interpolation,
    `'${oc.env:OPENAI_API_KEY}'`, and even the command line a run records holds no secret."""
    return field(default=default, metadata={SECRET: True})


def is_secret(config_field: Field) -> bool:
    return bool(config_field.metadata.get(SECRET))
