"""The hook plugins' options (`hook.NAME.FIELD=...`), apart from the hooks themselves, so that listing the plugins
and composing a run read them without importing any hook."""

from dataclasses import dataclass


@dataclass
class DynamicSamplingConfig:
    max_draws: int = 3  # extra rounds of generation per batch at most (DAPO's max_num_gen_batches)
    min_std: float = 1e-6  # a group whose reward std is at most this counts as having no spread
