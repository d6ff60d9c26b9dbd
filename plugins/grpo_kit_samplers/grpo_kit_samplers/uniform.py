"""uniform: shuffled passes over the prompts, each seen once per pass (TRL's order)."""

import torch

from grpo_kit_samplers.passes import Passes


class Uniform:
    def start(self, dataset, seed: int, shuffle: bool) -> None:
        self.passes = Passes(len(dataset), seed, shuffle)

    def draw(self, count: int) -> list[int]:
        return [self.passes.next() for _ in range(count)]

    def observe(self, indices: list[int], rewards: torch.Tensor) -> None:
        """Uniform draws take no notice of rewards."""

    def metrics(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict:
        return self.passes.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.passes.load_state_dict(state)
