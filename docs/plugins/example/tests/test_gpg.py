"""The GPG loss and advantage on small tensors whose expected values are worked out by hand in the comments."""

import pytest
import torch

from grpo_kit.testing import loss_inputs, reduction
from grpo_kit_example.gpg_advantage import GPGAdvantage, GPGAdvantageConfig
from grpo_kit_example.gpg_loss import GPG

# Two completions: 3 active tokens with A = +2, 2 active tokens (and one padding) with A = -1.
LOGPS = torch.tensor([[-0.5, -1.0, -2.0], [-0.25, -3.0, -9.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
ADVANTAGES = torch.tensor([[2.0], [-1.0]])


def test_loss_is_minus_advantage_times_log_prob_averaged_over_the_batch_tokens():
    gpg = GPG()
    logps = LOGPS.clone().requires_grad_()
    # A log-ratio far from 0 changes nothing: there is no importance ratio.
    inputs = loss_inputs(torch.full((2, 3), 0.7), ADVANTAGES, MASK, per_token_logps=logps)
    per_token, metrics = gpg.per_token_loss(inputs)
    # -A * logp: [1, 2, 4] and [-0.25, -3]
    torch.testing.assert_close(per_token[0], torch.tensor([1.0, 2.0, 4.0]))
    torch.testing.assert_close(per_token[1, :2], torch.tensor([-0.25, -3.0]))
    # (1 + 2 + 4 - 0.25 - 3) / 5 active tokens
    loss = gpg.reduce(per_token, MASK, reduction(5))
    assert loss.item() == pytest.approx(3.75 / 5)
    loss.backward()
    # d loss / d logp = -A / 5 on active tokens, 0 on padding
    torch.testing.assert_close(logps.grad, torch.tensor([[-0.4, -0.4, -0.4], [0.2, 0.2, 0.0]]))
    assert metrics["gpg/nonzero_advantage_share"].item() == 1.0


def test_the_token_mean_spans_the_generation_batch():
    # This micro-batch is half of an optimizer step of 2 micro-batches over a generation batch of 20 tokens:
    # sum / (20 * 2 / 2) = 3.75 / 20
    per_token, _ = GPG().per_token_loss(loss_inputs(torch.zeros(2, 3), ADVANTAGES, MASK, per_token_logps=LOGPS))
    loss = GPG().reduce(per_token, MASK, reduction(20, accumulation=2))
    assert loss.item() == pytest.approx(3.75 / 20)


# Three groups of two: rewards with spread, equal rewards (M = 1), spread.
REWARDS = torch.tensor([[1.0], [0.0], [1.0], [1.0], [0.0], [3.0]])


def test_advantage_is_centred_and_scaled_by_alpha():
    advantages = GPGAdvantage(GPGAdvantageConfig())(REWARDS, torch.ones(1), 2)
    # centred: [0.5, -0.5 | 0, 0 | -1.5, 1.5]; alpha = B / (B - M) = 3 / 2
    torch.testing.assert_close(advantages, torch.tensor([0.75, -0.75, 0.0, 0.0, -2.25, 2.25]))


def test_without_correction_and_with_std_it_is_grpos_advantage():
    config = GPGAdvantageConfig(gradient_correction=False, normalize_by_std=True)
    advantages = GPGAdvantage(config)(REWARDS, torch.ones(1), 2)
    # group stds (Bessel): sqrt(0.5), 0, sqrt(4.5); the 1e-4 keeps the equal group at 0
    low, high = 0.5 / (0.5**0.5 + 1e-4), 1.5 / (4.5**0.5 + 1e-4)
    expected = torch.tensor([low, -low, 0.0, 0.0, -high, high])
    torch.testing.assert_close(advantages, expected)


def test_alpha_is_one_when_no_group_has_spread():
    advantages = GPGAdvantage(GPGAdvantageConfig())(torch.ones(4, 1), torch.ones(1), 2)
    assert torch.equal(advantages, torch.zeros(4))


def test_an_unscorable_group_counts_as_having_no_spread():
    rewards = torch.tensor([[1.0], [0.0], [float("nan")], [float("nan")]])
    advantages = GPGAdvantage(GPGAdvantageConfig())(rewards, torch.ones(1), 2)
    # alpha = 2 groups / 1 with spread
    torch.testing.assert_close(advantages[:2], torch.tensor([1.0, -1.0]))
    assert advantages[2:].isnan().all()  # the core turns them into 0
