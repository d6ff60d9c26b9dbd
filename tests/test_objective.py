"""The core's part of the objective: KL, masks, correction and entropy bonus around any loss plugin."""

import logging

import pytest
import torch

import grpo_kit
from grpo_kit.contract.errors import ConfigError
from grpo_kit.objective.objective import high_entropy_mask, off_policy_mask
from grpo_kit.testing.micro_batches import objective_batch

MASK = torch.tensor([[1, 1, 0], [1, 1, 1]])


def objective(registry, *overrides):
    return grpo_kit.build_objective(grpo_kit.compose(["+loss=bnpo", *overrides], registry), registry)


def on_policy_batch(advantages=(1.0, -1.0), **extra):
    return objective_batch(MASK, torch.tensor(advantages), **extra)


def test_on_policy_bnpo_is_minus_the_mean_advantage_per_token(registry):
    logps = torch.tensor([[-1.0, -2.0, -9.0], [-0.5, -0.5, -0.5]], requires_grad=True)
    out = objective(registry)(logps, torch.ones(2, 3), on_policy_batch())
    # ratio 1 everywhere: -A per token; (-1 - 1 + 1 + 1 + 1) / 5 active tokens
    assert out.loss.item() == pytest.approx(0.2)
    out.loss.backward()
    torch.testing.assert_close(logps.grad, torch.tensor([[-0.2, -0.2, 0.0], [0.2, 0.2, 0.2]]))


def test_k3_kl_and_its_bias_correction(registry):
    logps = torch.zeros(2, 3)
    ref = torch.full((2, 3), -0.5)
    old = torch.full((2, 3), -0.2)
    batch = on_policy_batch(ref_per_token_logps=ref, old_per_token_logps=old, advantages=(0.0, 0.0))
    kl = torch.exp(torch.tensor(-0.5)) + 0.5 - 1  # k3 at ref - logp = -0.5
    plain = objective(registry, "algorithm.beta=0.1", "algorithm.use_bias_correction_kl=false")(
        logps, torch.ones(2, 3), batch
    )
    assert plain.loss.item() == pytest.approx(0.1 * kl.item(), rel=1e-5)
    assert plain.metrics["kl"].item() == pytest.approx(kl.item(), rel=1e-5)
    corrected = objective(registry, "algorithm.beta=0.1")(logps, torch.ones(2, 3), batch)
    assert corrected.loss.item() == pytest.approx(0.1 * kl.item() * torch.exp(torch.tensor(0.2)).item(), rel=1e-5)


def test_masked_tokens_change_neither_loss_nor_gradient(registry):
    def run(padding):
        logps = torch.tensor([[-1.0, -2.0, padding], [-0.5, -0.4, -0.3]], requires_grad=True)
        batch = on_policy_batch(
            old_per_token_logps=torch.tensor([[-1.1, -1.8, padding - 1], [-0.6, -0.4, -0.2]]),
            ref_per_token_logps=torch.tensor([[-0.9, -2.1, padding + 3], [-0.5, -0.5, -0.5]]),
        )
        out = objective(registry, "algorithm.beta=0.1", "algorithm.entropy_coef=0.01")(
            logps, torch.tensor([[0.5, 0.7, 40.0], [0.1, 0.2, 0.3]]), batch
        )
        out.loss.backward()
        return out.loss.detach(), logps.grad

    (loss_a, grad_a), (loss_b, grad_b) = run(-3.0), run(-30.0)
    torch.testing.assert_close(loss_a, loss_b)
    torch.testing.assert_close(grad_a, grad_b)


def test_rollout_ratio_multiplies_the_loss(registry):
    logps = torch.zeros(2, 3)
    ratio = torch.tensor([[2.0, 0.0, 5.0], [1.0, 1.0, 0.5]])
    out = objective(registry)(logps, torch.ones(2, 3), on_policy_batch(importance_sampling_ratio=ratio))
    # -A * ratio: (-2 - 0 + 1 + 1 + 0.5) / 5
    assert out.loss.item() == pytest.approx(0.1)


def test_high_entropy_mask_keeps_the_top_quantile_of_active_tokens():
    entropies = torch.tensor([[0.1, 0.9, 5.0], [0.5, 0.3, 0.7]])
    mask = high_entropy_mask(entropies, MASK.float(), quantile=0.6)
    # active entropies 0.1 0.9 0.5 0.3 0.7: the 0.6 quantile is 0.58; the padding token (5.0) never counts
    torch.testing.assert_close(mask, torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]))


def test_off_policy_mask_drops_stale_negative_sequences():
    logps = torch.zeros(3, 2)
    sampling = torch.tensor([[0.9, 0.9], [0.9, 0.9], [0.1, 0.1]])  # mean KL 0.9, 0.9, 0.1
    keep = off_policy_mask(torch.tensor([[1.0], [-1.0], [-1.0]]), logps, sampling, torch.ones(3, 2), threshold=0.5)
    torch.testing.assert_close(keep, torch.tensor([[1.0], [0.0], [1.0]]))


def test_entropy_bonus_lowers_the_loss_by_the_mean_entropy(registry):
    logps = torch.zeros(2, 3)
    entropies = torch.tensor([[1.0, 2.0, 99.0], [3.0, 4.0, 5.0]], requires_grad=True)
    bonus = objective(registry, "algorithm.entropy_coef=0.1")
    accumulated = grpo_kit.Reduction(float(MASK.sum()), 2, 1, 1, bonus.max_completion_length)  # 2 micro-batches a step
    out = bonus(logps, entropies, on_policy_batch(), accumulated)
    # policy 0.2 / 2; bonus 0.1 * mean(1, 2, 3, 4, 5) / 2
    assert out.loss.item() == pytest.approx(0.1 - 0.15)
    out.loss.backward()
    assert entropies.grad[0, 2] == 0 and entropies.grad[0, 0].item() == pytest.approx(-0.01)


@pytest.mark.parametrize("loss", ["dapo", "cispo", "vespo"])
def test_token_normalised_losses_give_the_same_gradient_whole_or_accumulated(registry, loss):
    torch.manual_seed(0)
    logps = -torch.rand(8, 5)
    mask = (torch.arange(5) < torch.randint(1, 6, (8, 1))).int()
    batch = objective_batch(mask, torch.randn(8), old_per_token_logps=logps + 0.2 * torch.randn(8, 5))
    run = grpo_kit.build_objective(grpo_kit.compose([f"+loss={loss}"], registry), registry)

    def gradient(chunks):
        reduction = grpo_kit.Reduction(float(mask.sum()), chunks, chunks, 1, run.max_completion_length)
        leaf = logps.clone().requires_grad_()
        for rows in torch.arange(8).chunk(chunks):
            run(leaf[rows], torch.ones(len(rows), 5), batch.rows(rows), reduction).loss.backward()
        return leaf.grad

    torch.testing.assert_close(gradient(1), gradient(4))


def test_discouraged_combination_warns_with_the_fix(registry, caplog):
    with caplog.at_level(logging.WARNING):
        grpo_kit.compose(["+loss=luspo"], registry)
    assert "loss luspo" in caplog.text and "use importance_sampling=sequence" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        grpo_kit.compose(["+loss=dapo", "importance_sampling=sequence"], registry)
    assert "weights each sequence by its length" in caplog.text


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["+loss=vespo", "rollout_correction=sequence_mask"], "vespo takes only token-level rollout corrections"),
        (["algorithm.sync_ref_model=true"], "set algorithm.beta"),
        (["generation.num_generations=1", "trainer.per_device_train_batch_size=1"], "num_generations >= 2"),
        (["algorithm.top_entropy_quantile=1.5"], "must lie in"),
        (["algorithm.off_policy_mask_threshold=-1"], "must be positive"),
    ],
)
def test_rejected_combinations_fail_at_composition(registry, overrides, message):
    with pytest.raises(ConfigError, match=message):
        grpo_kit.compose(overrides, registry)
