"""The sampler suite (grpo_kit/contract/kinds.py: Sampler)."""

import copy
import math
from typing import ClassVar

import datasets
import torch

from grpo_kit.testing.contracts.plugin import PluginContract


class SamplerContract(PluginContract):
    """A prompt sampler (kinds.py: Sampler): dataset indices for each draw, told each scored group's rewards, its
    state enough to draw on after a resume. `dataset_columns` are extra columns of the test prompts (a curriculum's
    `difficulty`), `options` the sampler's own (`{"column": "difficulty"}`)."""

    kind = "sampler"
    size: ClassVar[int] = 24
    num_generations: ClassVar[int] = 4
    dataset_columns: ClassVar[dict] = {"difficulty": [index % 5 for index in range(24)]}

    def dataset(self) -> datasets.Dataset:
        columns = {name: values[: self.size] for name, values in self.dataset_columns.items()}
        return datasets.Dataset.from_dict({"prompt": [f"{index}+1=" for index in range(self.size)], **columns})

    def started(self, contract_case, plugin_config, seed: int = 0):
        """A new sampler of the case, started on the test prompts."""
        sampler = contract_case.registry.build(self.kind, contract_case.name, copy.deepcopy(plugin_config))
        sampler.start(self.dataset(), seed, True)
        return sampler

    def rewards(self, indices: list[int], round_: int) -> torch.Tensor:  # (G, num_generations)
        """Rewards that differ by prompt and round: some groups all 1, some all 0, some spread, one unscored."""
        rows = []
        for index in indices:
            kind = (index + round_) % 4
            rows.append([1.0] * self.num_generations if kind == 0 else [0.0] * self.num_generations)
            if kind == 2:
                rows[-1] = [float(n % 2) for n in range(self.num_generations)]
            if kind == 3:
                rows[-1][0] = math.nan
        return torch.tensor(rows)

    def rounds(self, sampler, count: int, rounds: int) -> list[list[int]]:
        """`rounds` draws of `count`, each told its rewards."""
        draws = []
        for round_ in range(rounds):
            indices = sampler.draw(count)
            sampler.observe(indices, self.rewards(indices, round_))
            draws.append(list(indices))
        return draws

    def test_a_draw_is_that_many_indices_of_the_dataset(self, contract_case, plugin_config):
        sampler = self.started(contract_case, plugin_config)
        for count in (1, 7, self.size, self.size + 5):
            indices = sampler.draw(count)
            assert len(indices) == count, f"draw({count}) returned {len(indices)} indices"
            assert all(isinstance(index, int) and 0 <= index < self.size for index in indices), (
                f"draw({count}) returned {indices}: every index must be an int in [0, {self.size})"
            )
            sampler.observe(indices, self.rewards(indices, count))

    def test_the_same_calls_make_the_same_draws(self, contract_case, plugin_config):
        """What keeps the processes of a run deciding alike: each makes these calls with these arguments."""
        first, second = (self.rounds(self.started(contract_case, plugin_config), 6, 6) for _ in range(2))
        assert first == second, f"two samplers with one seed and the same observations drew {first} and {second}"

    def test_a_restored_state_draws_what_the_sampler_would_have(self, contract_case, plugin_config):
        sampler = self.started(contract_case, plugin_config)
        self.rounds(sampler, 6, 3)
        state = copy.deepcopy(sampler.state_dict())  # what a checkpoint keeps: no live object in it
        uninterrupted = self.rounds(sampler, 6, 4)
        resumed = self.started(contract_case, plugin_config, seed=1)  # its own seed's state is replaced
        resumed.load_state_dict(state)
        assert self.rounds(resumed, 6, 4) == uninterrupted, "a sampler restored from its state_dict drew otherwise"

    def test_unscored_groups_are_taken(self, contract_case, plugin_config):
        sampler = self.started(contract_case, plugin_config)
        indices = sampler.draw(4)
        sampler.observe(indices, torch.full((4, self.num_generations), math.nan))
        assert len(sampler.draw(4)) == 4

    def test_metrics_are_numbers(self, contract_case, plugin_config):
        sampler = self.started(contract_case, plugin_config)
        self.rounds(sampler, 6, 2)
        metrics = sampler.metrics()
        assert isinstance(metrics, dict) and all(
            isinstance(name, str) and isinstance(value, (int, float)) for name, value in metrics.items()
        ), f"metrics() must map names to numbers, got {metrics!r}"
