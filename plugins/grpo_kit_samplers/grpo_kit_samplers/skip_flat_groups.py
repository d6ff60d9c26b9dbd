"""skip_flat_groups: uniform's shuffled passes, skipping each prompt whose last `groups` groups all had rewards of
zero variance. Such groups have no advantage and teach nothing (OpenRLHF and NeMo-RL filter them; DAPO's dynamic
sampling redraws them after generating them): skipping the prompt before it is generated saves the generation.
A pass in which every prompt is skipped draws them anyway, so that a run never stalls."""

import torch

from grpo_kit.contract.errors import ConfigError
from grpo_kit_samplers.configs import SkipFlatGroupsConfig
from grpo_kit_samplers.passes import Passes


class SkipFlatGroups:
    def __init__(self, config: SkipFlatGroupsConfig):
        if config.groups < 1:
            raise ConfigError(f"sampler.groups={config.groups} must be at least 1.")
        self.config = config

    def start(self, dataset, seed: int, shuffle: bool) -> None:
        self.passes = Passes(len(dataset), seed, shuffle)
        self.size = len(dataset)
        self.flat_runs: dict[int, int] = {}  # index -> its last groups in a row whose rewards were all equal
        self.skipped = self.groups_seen = self.flat_groups = 0

    def draw(self, count: int) -> list[int]:
        picked, passed_over = [], 0
        while len(picked) < count:
            index = self.passes.next()
            if self.flat_runs.get(index, 0) >= self.config.groups and passed_over < self.size:
                passed_over += 1  # after a whole pass of skips, skipped prompts are drawn too
                continue
            picked.append(index)
        self.skipped += passed_over
        return picked

    def observe(self, indices: list[int], rewards: torch.Tensor) -> None:
        for index, group in zip(indices, rewards.tolist()):
            scored = [reward for reward in group if reward == reward]  # NaN: no reward had an opinion
            flat = len(set(scored)) <= 1
            self.flat_runs[index] = self.flat_runs.get(index, 0) + 1 if flat else 0
            self.groups_seen += 1
            self.flat_groups += flat

    def metrics(self) -> dict[str, float]:
        metrics = {
            "skipped": float(self.skipped),
            "flat_group_share": self.flat_groups / self.groups_seen if self.groups_seen else float("nan"),
            "flagged": float(sum(runs >= self.config.groups for runs in self.flat_runs.values())),
        }
        self.skipped = self.groups_seen = self.flat_groups = 0
        return metrics

    def state_dict(self) -> dict:
        return {"passes": self.passes.state_dict(), "flat_runs": {str(i): n for i, n in self.flat_runs.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.passes.load_state_dict(state["passes"])
        self.flat_runs = {int(index): runs for index, runs in state["flat_runs"].items()}
