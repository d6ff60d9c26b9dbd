"""difficulty_pool: pools of easy, medium and hard prompts by their recent pass rate, each drawn with its share,
and prompts that every completion or none solves set aside for a while (prime-rl's idea).

A prompt's pass rate is the share of its completions, over its last `window` groups, whose reward reaches
`correct_threshold`. Never scored, a prompt is medium. Within a pool, prompts are drawn at random without
replacement within a draw.
"""

import math
import random

import torch

from grpo_kit.contract.errors import ConfigError
from grpo_kit_samplers.configs import DifficultyPoolConfig

POOLS = ("easy", "medium", "hard")


class DifficultyPool:
    def __init__(self, config: DifficultyPoolConfig):
        shares = (config.easy_share, config.medium_share, config.hard_share)
        if min(shares) < 0 or not math.isclose(sum(shares), 1.0):
            raise ConfigError(
                f"sampler: easy_share, medium_share and hard_share ({', '.join(map(str, shares))}) must be at least 0 "
                "and add up to 1."
            )
        if not 0.0 <= config.hard_below <= config.easy_above <= 1.0:
            raise ConfigError(
                f"sampler.hard_below={config.hard_below} and sampler.easy_above={config.easy_above} are pass rates: "
                "0 <= hard_below <= easy_above <= 1."
            )
        if config.window < 1 or config.set_aside_passes < 0:
            raise ConfigError("sampler.window must be at least 1, and sampler.set_aside_passes at least 0.")
        self.config = config
        self.shares = dict(zip(POOLS, shares))

    def start(self, dataset, seed: int, shuffle: bool) -> None:
        if not shuffle:
            raise ConfigError(
                "data.shuffle=false keeps the dataset's own order, which sampler=difficulty_pool does not have: it "
                "draws from its pools at random. Use data.shuffle=true, or sampler=uniform."
            )
        self.size = len(dataset)
        self.rng = random.Random(seed)
        self.passes: dict[int, list[float]] = {}  # index -> pass rates of its last groups, oldest first
        self.set_aside: dict[int, int] = {}  # index -> the prompts drawn by which it comes back
        self.drawn = 0  # prompts drawn so far
        self.last_drawn = dict.fromkeys(POOLS, 0)

    def pool_of(self, index: int) -> str:
        rates = self.passes.get(index)
        if not rates:
            return "medium"
        rate = sum(rates) / len(rates)
        return "easy" if rate > self.config.easy_above else "hard" if rate < self.config.hard_below else "medium"

    def pools(self) -> dict[str, list[int]]:
        pools = {pool: [] for pool in POOLS}
        for index in range(self.size):
            if self.set_aside.get(index, 0) <= self.drawn:
                pools[self.pool_of(index)].append(index)
        return pools

    def draw(self, count: int) -> list[int]:
        pools = self.pools()
        wanted = {pool: math.floor(count * self.shares[pool]) for pool in POOLS}
        wanted["medium"] += count - sum(wanted.values())
        picked = {pool: self.rng.sample(pools[pool], min(wanted[pool], len(pools[pool]))) for pool in POOLS}
        short = count - sum(map(len, picked.values()))
        for pool in ("medium", "hard", "easy"):  # a pool too small leaves its share to the others
            taken = set(picked[pool])
            spare = [index for index in pools[pool] if index not in taken]
            extra = self.rng.sample(spare, min(short, len(spare)))
            picked[pool] += extra
            short -= len(extra)
        if short:  # everything left is set aside: the prompts that come back soonest
            waiting = sorted(self.set_aside, key=lambda index: (self.set_aside[index], index))
            back = [index for index in waiting if self.set_aside[index] > self.drawn][:short]
            picked["medium"] += back
            short -= len(back)
        if short:  # a draw larger than the dataset: some prompts twice
            picked["medium"] += [self.rng.randrange(self.size) for _ in range(short)]
        self.last_drawn = {pool: len(indices) for pool, indices in picked.items()}
        self.drawn += count
        return [index for pool in POOLS for index in picked[pool]]

    def observe(self, indices: list[int], rewards: torch.Tensor) -> None:
        passed = (rewards >= self.config.correct_threshold).float()  # (G, num_generations); NaN never passes
        for index, group in zip(indices, passed.tolist()):
            rates = self.passes.setdefault(index, [])
            rates.append(sum(group) / len(group))
            del rates[: -self.config.window]
            if self.config.set_aside_passes and min(group) == max(group):  # all solved, or none
                self.set_aside[index] = self.drawn + self.config.set_aside_passes * self.size

    def metrics(self) -> dict[str, float]:
        pools = self.pools()
        aside = sum(1 for back in self.set_aside.values() if back > self.drawn)
        metrics = {f"pool/{pool}": float(len(pools[pool])) for pool in POOLS}
        metrics |= {f"drawn/{pool}": float(self.last_drawn[pool]) for pool in POOLS}
        return metrics | {"set_aside": float(aside)}

    def state_dict(self) -> dict:
        return {
            "rng": self.rng.getstate(),
            "passes": {str(index): rates for index, rates in self.passes.items()},
            "set_aside": {str(index): back for index, back in self.set_aside.items()},
            "drawn": self.drawn,
        }

    def load_state_dict(self, state: dict) -> None:
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        self.passes = {int(index): list(rates) for index, rates in state["passes"].items()}
        self.set_aside = {int(index): back for index, back in state["set_aside"].items()}
        self.drawn = state["drawn"]
