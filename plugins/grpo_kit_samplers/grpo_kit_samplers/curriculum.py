"""curriculum: the easiest prompts first, by a dataset column, with a pace: draws come from the easiest
`start_share` of the prompts at first, a share that grows linearly to all of them over the first `full_after`
prompts drawn (verl's curriculum sampler, with a linear pace)."""

import math
import random

import torch

from grpo_kit.contract.errors import ConfigError
from grpo_kit_samplers.configs import CurriculumConfig


class Curriculum:
    def __init__(self, config: CurriculumConfig):
        if config.column is None:
            raise ConfigError(
                "sampler=curriculum orders prompts by a dataset column: name it with sampler.column=NAME "
                "(a number per prompt, easiest smallest; sampler.descending=true for largest first)."
            )
        if not 0.0 < config.start_share <= 1.0:
            raise ConfigError(f"sampler.start_share={config.start_share} must lie in (0, 1].")
        if config.full_after is not None and config.full_after < 1:
            raise ConfigError(f"sampler.full_after={config.full_after} must be at least 1 prompt (or null).")
        self.config = config

    def start(self, dataset, seed: int, shuffle: bool) -> None:
        column = self.config.column
        if column not in dataset.column_names:
            raise ConfigError(
                f"sampler.column={column}: the training dataset has no such column (it has "
                f"{', '.join(dataset.column_names)})."
            )
        if not shuffle:
            raise ConfigError(
                "data.shuffle=false keeps the dataset's own order; sampler=curriculum draws in its column's order, "
                "at random within the share it has reached. Use data.shuffle=true, or sampler=uniform."
            )
        values = dataset[column]
        if not all(isinstance(value, (int, float)) and not isinstance(value, bool) for value in values):
            raise ConfigError(f"sampler.column={column} must hold a number for every prompt.")
        self.order = sorted(
            range(len(values)), key=lambda index: (values[index], index), reverse=self.config.descending
        )
        self.full_after = self.config.full_after or len(values)
        self.rng = random.Random(seed)
        self.drawn = 0

    def reached(self) -> int:
        """How many of the easiest prompts draws may come from now."""
        progress = min(1.0, self.drawn / self.full_after)
        share = self.config.start_share + (1.0 - self.config.start_share) * progress
        return max(1, math.ceil(share * len(self.order)))

    def draw(self, count: int) -> list[int]:
        pool = self.order[: self.reached()]
        picked = self.rng.sample(pool, min(count, len(pool)))
        picked += [self.rng.choice(pool) for _ in range(count - len(picked))]  # a pool smaller than the draw
        self.drawn += count
        return picked

    def observe(self, indices: list[int], rewards: torch.Tensor) -> None:
        """The pace is in prompts drawn, not in rewards."""

    def metrics(self) -> dict[str, float]:
        return {"pool_share": self.reached() / len(self.order), "pool_size": float(self.reached())}

    def state_dict(self) -> dict:
        return {"rng": self.rng.getstate(), "drawn": self.drawn}

    def load_state_dict(self, state: dict) -> None:
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        self.drawn = state["drawn"]
