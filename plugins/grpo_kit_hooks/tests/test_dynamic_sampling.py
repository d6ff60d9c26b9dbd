"""Dynamic sampling on hand-made scored batches: flat groups are replaced by drawn ones, up to the cap."""

import pytest
import torch

from grpo_kit.contract.kinds import Completions
from grpo_kit.contract.pipeline import ScoredBatch
from grpo_kit_hooks.dynamic_sampling import DynamicSampling, DynamicSamplingConfig


def scored(group_rewards: list[list[float]], tag: str, length: int = 3) -> ScoredBatch:
    rewards = torch.tensor([float(r) for group in group_rewards for r in group])
    n = len(rewards)
    generated = Completions(
        torch.ones(n, length, dtype=torch.long), torch.ones(n, length), torch.zeros(n, dtype=torch.bool)
    )
    return ScoredBatch(
        rows=[{"prompt": f"{tag}{g}"} for g, group in enumerate(group_rewards) for _ in group],
        prompt_ids=[[1]] * n,
        completions=["x"] * n,
        completion_ids=[[1]] * n,
        generated=generated,
        rewards_per_func=rewards.unsqueeze(1),
        rewards=rewards,
        num_generations=len(group_rewards[0]),
    )


def test_flat_groups_are_replaced_by_drawn_groups_with_spread():
    batches = iter([scored([[1, 1], [0, 1]], "b", length=5), scored([[1, 0], [0, 0]], "c")])
    first = scored([[0, 0], [1, 0], [1, 1]], "a")
    kept = DynamicSampling(DynamicSamplingConfig(max_draws=3)).on_rollout_scored(None, first, lambda n: next(batches))
    assert kept.num_groups == 3
    assert [row["prompt"] for row in kept.rows[::2]] == ["a1", "b1", "c0"]
    assert (kept.group_std() > 0).all()
    assert kept.metrics["dynamic_sampling/draws"] == 2.0
    assert kept.metrics["dynamic_sampling/drawn_groups"] == 4.0
    assert kept.generated.completion_ids.shape == (6, 5)  # padded to the longest draw
    assert kept.generated.completion_mask[0, 3:].sum() == 0


def test_out_of_draws_tops_up_with_flat_groups():
    first = scored([[0, 0], [1, 0], [1, 1]], "a")
    kept = DynamicSampling(DynamicSamplingConfig(max_draws=1)).on_rollout_scored(
        None, first, lambda n: scored([[1, 1], [0, 0], [1, 1]], "b")
    )
    assert [row["prompt"] for row in kept.rows[::2]] == ["a1", "a0", "a2"]
    assert kept.metrics["dynamic_sampling/zero_std_before"] == pytest.approx(2 / 3)
