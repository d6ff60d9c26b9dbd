"""failure_replay's draws, worked by hand."""

import datasets
import torch

from grpo_kit.plugins.registry import Registry


def test_failed_prompts_come_back_in_the_next_draw():
    sampler = Registry().build("sampler", "failure_replay", {"share": 0.5, "below": 0.5})
    sampler.start(datasets.Dataset.from_dict({"prompt": [str(index) for index in range(10)]}), 0, True)
    first = sampler.draw(4)
    rewards = torch.tensor([[0.0, 0.0], [1.0, 1.0], [0.0, 1.0], [float("nan"), 0.0]])  # means 0, 1, 0.5, 0
    sampler.observe(first, rewards)
    second = sampler.draw(4)
    assert second[:2] == [first[0], first[3]]  # the failures, oldest first, in half of the draw
    assert sampler.metrics() == {"replayed": 2.0, "failures_waiting": 0.0}
