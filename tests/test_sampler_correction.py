"""The rollout correction's owner: its metrics over a generation batch whose micro-batches have widths of their own."""

import pytest
import torch
from accelerate import Accelerator

import grpo_kit
from grpo_kit.objective.sampler_correction import SamplerCorrection
from grpo_kit.testing.micro_batches import objective_batch


@pytest.mark.parametrize("correction", ["token_truncate", "sequence_mask"])
def test_the_metrics_of_micro_batches_cut_to_their_own_widths_are_the_whole_batch_s(registry, correction):
    cfg = grpo_kit.compose([f"rollout_correction={correction}", "algorithm.correct_policy_sampler=true"], registry)
    owner = SamplerCorrection.of(cfg, registry)
    generator = torch.Generator().manual_seed(0)
    lengths = torch.tensor([5, 2, 3, 1])
    mask = (torch.arange(5) < lengths[:, None]).long()  # (4, 5)
    old = -torch.rand(4, 5, generator=generator)
    whole = objective_batch(mask, torch.zeros(4), old_per_token_logps=old, sampling_per_token_logps=old - 0.1 * mask)
    whole = whole.with_references(importance_sampling_ratio=owner.ratio(whole))
    halves = [whole.rows(torch.tensor([0, 1])), whole.rows(torch.tensor([2, 3])).cut(3)]  # widths 5 and 3
    accelerator = Accelerator(cpu=True)
    assert owner.applies
    assert owner.metrics(halves, accelerator) == pytest.approx(owner.metrics([whole], accelerator))
