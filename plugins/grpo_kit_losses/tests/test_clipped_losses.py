"""grpo and dapo on small tensors whose expected values are worked out by hand in the comments."""

import math

import pytest
import torch

from grpo_kit.testing import loss_inputs, reduction
from grpo_kit_losses.bnpo import BNPO
from grpo_kit_losses.clipped import ClippedConfig
from grpo_kit_losses.dapo import DAPO
from grpo_kit_losses.dr_grpo import DrGRPO
from grpo_kit_losses.grpo import GRPO
from grpo_kit_losses.luspo import LUSPO

# Two sequences: ratios exp(log_w) = [1.5, 0.5, 1.0 | 1.1, 0.7, pad], advantages +1 and -1.
LOG_WEIGHTS = torch.log(torch.tensor([[1.5, 0.5, 1.0], [1.1, 0.7, 9.0]]))
ADVANTAGES = torch.tensor([[1.0], [-1.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
# A > 0: -min(r, clip(r, 0.8, 1.2)) = [-1.2, -0.5, -1.0]; A < 0: -min(-r, -clip(r)) = max(r, clip(r)) = [1.1, 0.8]


def test_per_token_loss_and_clip_metrics():
    loss, metrics = GRPO(ClippedConfig(epsilon=0.2)).per_token_loss(loss_inputs(LOG_WEIGHTS, ADVANTAGES, MASK))
    torch.testing.assert_close(loss[0], torch.tensor([-1.2, -0.5, -1.0]))
    torch.testing.assert_close(loss[1, :2], torch.tensor([1.1, 0.8]))
    # clipped tokens: 1.5 with A>0 (high); 0.7 with A<0 (low); 0.5 with A>0 is not clipped by the min. 5 active.
    assert metrics["clip_ratio/high_mean"].item() == pytest.approx(1 / 5)
    assert metrics["clip_ratio/low_mean"].item() == pytest.approx(1 / 5)
    assert metrics["clip_ratio/region_mean"].item() == pytest.approx(2 / 5)
    # per sequence: high 1/3 and 0, low 0 and 1/2
    assert metrics["clip_ratio/high_max"].item() == pytest.approx(1 / 3)
    assert metrics["clip_ratio/low_min"].item() == pytest.approx(0.0)


def test_epsilon_high_and_delta():
    loss, _ = DAPO(ClippedConfig(epsilon=0.2, epsilon_high=0.6)).per_token_loss(
        loss_inputs(LOG_WEIGHTS, ADVANTAGES, MASK)
    )
    assert loss[0, 0].item() == pytest.approx(-1.5)  # 1.5 is inside [0.8, 1.6]
    loss, _ = DAPO(ClippedConfig(epsilon=0.2, delta=1.05)).per_token_loss(loss_inputs(LOG_WEIGHTS, ADVANTAGES, MASK))
    assert loss[1, 0].item() == pytest.approx(1.1)  # A<0: max(min(1.1, 1.05), clip(1.1)=1.1) = 1.1
    assert loss[0, 0].item() == pytest.approx(-1.05)  # A>0: min(min(1.5, 1.05), 1.2) = 1.05


def test_grpo_averages_each_sequence_then_the_batch():
    per_token = torch.tensor([[-1.2, -0.5, -1.0], [1.1, 0.8, 123.0]])
    # sequence means: -2.7/3 = -0.9 and 1.9/2 = 0.95; their mean 0.025; halved for 2 accumulation steps
    loss = GRPO(ClippedConfig()).reduce(per_token, MASK, reduction(5, accumulation=2))
    assert loss.item() == pytest.approx(0.0125)


def test_dapo_divides_by_the_active_tokens_of_the_generation_batch():
    per_token = torch.tensor([[-1.2, -0.5, -1.0], [1.1, 0.8, 123.0]])
    # sum over active tokens -0.8, over 10 tokens in the generation batch on 2 processes: -0.8 / (10 / 2)
    loss = DAPO(ClippedConfig()).reduce(per_token, MASK, reduction(10, processes=2))
    assert loss.item() == pytest.approx(-0.16)
    # 4 accumulation steps over a generation batch of 8 micro-batches: an optimizer step sees 10 / 2 * 4 / 8 tokens
    loss = DAPO(ClippedConfig()).reduce(
        per_token, MASK, reduction(10, accumulation=4, steps_per_generation=8, processes=2)
    )
    assert loss.item() == pytest.approx(-0.8 / 2.5)


def test_bnpo_divides_by_the_micro_batch_tokens():
    per_token = torch.tensor([[-1.2, -0.5, -1.0], [1.1, 0.8, 123.0]])
    loss = BNPO(ClippedConfig()).reduce(per_token, MASK, reduction(99, accumulation=2))
    assert loss.item() == pytest.approx(-0.8 / 5 / 2)


def test_dr_grpo_divides_by_batch_size_times_max_length():
    per_token = torch.tensor([[-1.2, -0.5, -1.0], [1.1, 0.8, 123.0]])
    loss = DrGRPO(ClippedConfig()).reduce(per_token, MASK, reduction(99, max_length=4))
    assert loss.item() == pytest.approx(-0.8 / (2 * 4))


def test_luspo_weights_each_sequence_by_its_length():
    per_sequence = torch.tensor([[0.5], [-2.0]])  # (B, 1), from sequence-level weights
    # 0.5 x 3 tokens and -2.0 x 2 tokens, mean over sequences: (1.5 - 4.0) / 2
    loss = LUSPO(ClippedConfig()).reduce(per_sequence, MASK, reduction(5))
    assert loss.item() == pytest.approx(-1.25)


@pytest.mark.parametrize("loss_class", [GRPO, BNPO, DrGRPO, DAPO, LUSPO])
def test_masked_tokens_change_neither_loss_nor_gradient(loss_class):
    loss_fn = loss_class(ClippedConfig())

    def loss_and_grad(padding_value):
        logps = torch.tensor([[-0.3, -1.2, -0.7], [-0.4, -2.0, padding_value]], requires_grad=True)
        old = torch.tensor([[-0.5, -1.0, -0.7], [-0.3, -2.1, -0.9]])
        per_token, _ = loss_fn.per_token_loss(loss_inputs(logps - old, ADVANTAGES, MASK, per_token_logps=logps))
        loss = loss_fn.reduce(per_token, MASK, reduction(MASK.sum().item()))
        loss.backward()
        return loss.detach(), logps.grad

    loss_a, grad_a = loss_and_grad(-0.1)
    loss_b, grad_b = loss_and_grad(-50.0)
    torch.testing.assert_close(loss_a, loss_b)
    torch.testing.assert_close(grad_a, grad_b)
    assert grad_a[1, 2] == 0


def test_dapo_gradient_is_the_same_whole_or_accumulated():
    torch.manual_seed(0)
    logps = torch.randn(4, 5)
    old = logps + 0.1 * torch.randn(4, 5)
    advantages = torch.randn(4, 1)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 1, 1, 0]], dtype=torch.float)
    dapo = DAPO(ClippedConfig())

    def gradient(chunks):
        leaf = logps.clone().requires_grad_()
        for rows in torch.arange(4).chunk(chunks):
            x = loss_inputs(leaf[rows] - old[rows], advantages[rows], mask[rows], per_token_logps=leaf[rows])
            per_token, _ = dapo.per_token_loss(x)
            dapo.reduce(per_token, mask[rows], reduction(mask.sum().item(), accumulation=chunks)).backward()
        return leaf.grad

    torch.testing.assert_close(gradient(1), gradient(2))
    assert not math.isclose(gradient(1).abs().sum().item(), 0.0)
