"""cispo, sapo and vespo on small tensors with their expected values worked out by hand."""

import math

import pytest
import torch

from grpo_kit.testing import loss_inputs, reduction
from grpo_kit_losses.cispo import CISPO, CISPOConfig
from grpo_kit_losses.sapo import SAPO, SAPOConfig
from grpo_kit_losses.vespo import VESPO, VESPOConfig

MASK = torch.tensor([[1.0, 1.0], [1.0, 0.0]])


def test_cispo_clips_the_detached_weight_and_keeps_every_gradient():
    logps = torch.tensor([[-0.5, -1.0], [-2.0, -3.0]], requires_grad=True)
    log_weights = torch.log(torch.tensor([[1.5, 0.5], [4.0, 1.0]]))
    advantages = torch.tensor([[2.0], [-1.0]])
    loss_fn = CISPO(CISPOConfig(epsilon_high=1.2))
    per_token, metrics = loss_fn.per_token_loss(loss_inputs(log_weights, advantages, MASK, per_token_logps=logps))
    # -min(r, 1.2) * A * logp: -1.2*2*-0.5 = 1.2, -0.5*2*-1.0 = 1.0, -1.2*-1*-2.0 = -2.4
    torch.testing.assert_close(per_token[0], torch.tensor([1.2, 1.0]))
    assert per_token[1, 0].item() == pytest.approx(-2.4)
    per_token[0].sum().backward()
    # the clipped token still has a gradient: d/dlogp = -1.2 * 2
    torch.testing.assert_close(logps.grad[0], torch.tensor([-2.4, -1.0]))
    # clipped with a positive advantage: token 1.5 only (4.0 has A < 0); 3 active tokens
    assert metrics["cispo_clip_ratio"].item() == pytest.approx(1 / 3)
    # dapo's reduction: sum over active tokens / tokens
    assert loss_fn.reduce(per_token.detach(), MASK, reduction(3)).item() == pytest.approx((1.2 + 1.0 - 2.4) / 3)


def test_sapo_soft_gate():
    log_weights = torch.log(torch.tensor([[1.0, 1.5], [0.8, 1.0]]))
    advantages = torch.tensor([[1.0], [-2.0]])
    per_token, _ = SAPO(SAPOConfig(temperature_pos=1.0, temperature_neg=2.0)).per_token_loss(
        loss_inputs(log_weights, advantages, MASK)
    )
    sigmoid = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    # A > 0, tau 1: -sigmoid(r - 1) * 4 * A; A < 0, tau 2: -sigmoid(2 (r - 1)) * 2 * A
    assert per_token[0, 0].item() == pytest.approx(-2.0)  # r = 1: sigmoid(0) * 4 = 2
    assert per_token[0, 1].item() == pytest.approx(-sigmoid(0.5) * 4)
    assert per_token[1, 0].item() == pytest.approx(sigmoid(-0.4) * 2 * 2)


def test_sapo_gate_has_the_ratios_slope_at_one():
    log_weights = torch.zeros(1, 1, requires_grad=True)
    per_token, _ = SAPO(SAPOConfig()).per_token_loss(loss_inputs(log_weights, torch.tensor([[1.0]]), MASK[:1, :1]))
    per_token.sum().backward()
    assert log_weights.grad.item() == pytest.approx(-1.0)  # like -r * A at r = 1


def test_vespo_gamma_weight():
    # sequence 1: log-ratios 0.1 + 0.2 -> w = e^0.3; sequence 2: only its first token counts, w = e^-0.5
    log_ratio = torch.tensor([[0.1, 0.2], [-0.5, 7.0]])
    advantages = torch.tensor([[1.0], [-1.0]])
    logps = torch.tensor([[-1.0, -2.0], [-0.5, -0.1]])
    loss_fn = VESPO(VESPOConfig(k_pos=2.0, lambda_pos=3.0, k_neg=3.0, lambda_neg=2.0))
    per_token, metrics = loss_fn.per_token_loss(loss_inputs(log_ratio, advantages, MASK, logps, log_ratio))
    phi = lambda w, k, lam: math.exp(lam) * w**k * math.exp(-lam * w)  # noqa: E731
    phi_1, phi_2 = phi(math.exp(0.3), 2.0, 3.0), phi(math.exp(-0.5), 3.0, 2.0)
    assert per_token[0, 1].item() == pytest.approx(-phi_1 * 1.0 * -2.0, rel=1e-5)
    assert per_token[1, 0].item() == pytest.approx(-phi_2 * -1.0 * -0.5, rel=1e-5)
    assert metrics["vespo/phi_seq_mean"].item() == pytest.approx((phi_1 + phi_2) / 2, rel=1e-5)
    assert phi(1.0, 2.0, 3.0) == pytest.approx(1.0)


def test_vespo_folds_a_token_correction_into_its_weight():
    log_ratio = torch.zeros(1, 2)
    correction = torch.tensor([[2.0, 0.5]])  # product 1: no change
    loss_fn = VESPO(VESPOConfig())
    plain = loss_fn.gamma_weight(loss_inputs(log_ratio, torch.ones(1, 1), MASK[:1]))
    folded = loss_fn.gamma_weight(loss_inputs(log_ratio, torch.ones(1, 1), MASK[:1], rollout_ratio=correction))
    torch.testing.assert_close(plain, folded)
    shifted = loss_fn.gamma_weight(loss_inputs(log_ratio, torch.ones(1, 1), MASK[:1], rollout_ratio=correction * 2))
    assert shifted.item() == pytest.approx(math.exp(3.0) * 4**2 * math.exp(-3.0 * 4), rel=1e-5)  # w = 4
    assert VESPO.consumes_rollout_ratio
