"""failure_replay: shuffled passes over the prompts, as uniform draws them, with a share of each draw given to
prompts whose last group's mean reward fell below a bar: the failures come back while they are still failures."""

import random

import torch

from grpo_kit_example.configs import FailureReplayConfig


class FailureReplay:
    def __init__(self, config: FailureReplayConfig):
        self.config = config

    def start(self, dataset, seed: int, shuffle: bool) -> None:
        self.size, self.shuffle = len(dataset), shuffle
        self.rng = random.Random(seed)
        self.order: list[int] = []  # the pass under way, popped from the end
        self.failed: list[int] = []  # prompts whose last group fell below the bar, oldest first
        self.replayed = 0

    def draw(self, count: int) -> list[int]:
        replays = min(int(count * self.config.share), len(self.failed))
        drawn = [self.failed.pop(0) for _ in range(replays)]
        while len(drawn) < count:
            if not self.order:
                self.order = list(range(self.size))
                if self.shuffle:
                    self.rng.shuffle(self.order)
            drawn.append(self.order.pop())
        self.replayed += replays
        return drawn

    def observe(self, indices: list[int], rewards: torch.Tensor) -> None:
        means = rewards.nan_to_num(0.0).mean(dim=1).tolist()  # (G,): no opinion counts as a failure
        for index, mean in zip(indices, means):
            if index in self.failed:
                self.failed.remove(index)
            if mean < self.config.below:
                self.failed.append(index)

    def metrics(self) -> dict[str, float]:
        metrics = {"replayed": float(self.replayed), "failures_waiting": float(len(self.failed))}
        self.replayed = 0
        return metrics

    def state_dict(self) -> dict:
        return {"rng": self.rng.getstate(), "order": list(self.order), "failed": list(self.failed)}

    def load_state_dict(self, state: dict) -> None:
        version, internal, gauss = state["rng"]  # a checkpoint may hold the tuple as lists
        self.rng.setstate((version, tuple(internal), gauss))
        self.order, self.failed = list(state["order"]), list(state["failed"])
