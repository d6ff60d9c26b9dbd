"""The loss suite (grpo_kit/contract/kinds.py: Loss)."""

from collections.abc import Sequence
from typing import ClassVar

import pytest
import torch

from grpo_kit.contract.kinds import LossInputs, Reduction, declared
from grpo_kit.testing.contracts.checks import SEQUENCE, TOKEN, assert_close, random_completions
from grpo_kit.testing.contracts.plugin import PluginContract


def _log_weights(log_ratio: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    """Log importance weights as the two standard levels form them: per token, or GSPO's per-sequence mean."""
    if level == TOKEN:
        return log_ratio
    return ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)


class LossContract(PluginContract):
    """A loss (grpo_kit/contract/kinds.py: Loss) on random inputs, with the importance weights of both levels.

    `required_metrics`: metric names the loss must report. A loss that declares `accumulation_invariant = True`
    must give the gradient of the whole batch however the batch is split into equal micro-batches, in order or
    grouped by length, with gradient accumulation.
    """

    kind = "loss"
    required_metrics: ClassVar[Sequence[str]] = ()

    def evaluate(
        self,
        loss,
        per_token_logps,
        old_per_token_logps,
        advantages,
        mask,
        level,
        rollout_ratio=None,
        accumulation=1,
        num_items_in_batch=None,
    ):
        """The loss as the core's objective applies it: weights -> per-token loss -> correction -> reduction."""
        log_ratio = per_token_logps - old_per_token_logps
        inputs = LossInputs(
            _log_weights(log_ratio, mask, level), log_ratio, advantages, per_token_logps, mask, rollout_ratio
        )
        per_token_loss, metrics = loss.per_token_loss(inputs)
        if rollout_ratio is not None and not declared(loss, "loss", "consumes_rollout_ratio"):
            per_token_loss = per_token_loss * rollout_ratio
        total_tokens = float(mask.sum()) if num_items_in_batch is None else num_items_in_batch
        reduction = Reduction(total_tokens, accumulation, accumulation, 1, mask.shape[1])
        return loss.reduce(per_token_loss, mask, reduction), metrics

    def loss_and_gradient(self, loss, per_token_logps, old_per_token_logps, advantages, mask, level, **kwargs):
        leaf = per_token_logps.clone().requires_grad_()
        value, metrics = self.evaluate(loss, leaf, old_per_token_logps, advantages, mask, level, **kwargs)
        is_scalar = isinstance(value, torch.Tensor) and value.dim() == 0
        assert is_scalar, f"reduce() must return a scalar tensor, got {value!r}"
        assert value.requires_grad, (
            "the loss does not depend on the policy's log-probs (inputs.per_token_logps, or inputs.log_weights and "
            "inputs.log_ratio, which carry their gradient): nothing would train"
        )
        value.backward()
        return value.detach(), leaf.grad, metrics

    def rollout_ratios(self, loss, mask):
        """No correction, and a ratio of every level the loss accepts (values in [0.5, 2])."""
        accepted = declared(loss, "loss", "rollout_correction_levels")
        ratios = {"no correction": None}
        generator = torch.Generator().manual_seed(7)
        if accepted is None or TOKEN in accepted:
            ratios["token-level correction"] = torch.rand(mask.shape, generator=generator) * 1.5 + 0.5
        if accepted is None or SEQUENCE in accepted:
            ratios["sequence-level correction"] = torch.rand(mask.shape[0], 1, generator=generator) * 1.5 + 0.5
        return ratios

    def test_declares_what_the_core_reads(self, plugin):
        level = declared(plugin, "loss", "importance_sampling_level")
        assert level in (None, TOKEN, SEQUENCE), "importance_sampling_level must be None, 'token' or 'sequence'"
        if level is not None:
            advice = declared(plugin, "loss", "importance_sampling_advice")
            assert isinstance(advice, str) and advice, (
                "a loss that wants one importance-sampling level says why in importance_sampling_advice (the "
                "warning a run shows for the other level)"
            )
        levels = declared(plugin, "loss", "rollout_correction_levels")
        assert levels is None or set(levels) <= {TOKEN, SEQUENCE}, "rollout_correction_levels: None, or levels"
        consumes = declared(plugin, "loss", "consumes_rollout_ratio")
        assert isinstance(consumes, bool), "consumes_rollout_ratio must be True or False"

    @pytest.mark.parametrize("level", [TOKEN, SEQUENCE])
    def test_loss_and_gradient_are_finite(self, plugin, level):
        logps, mask, advantages = random_completions(seed=0)
        noise = torch.randn(logps.shape, generator=torch.Generator().manual_seed(1)) * 0.3
        for policy in ("on-policy", "off-policy"):
            old = logps if policy == "on-policy" else logps + noise
            for correction, ratio in self.rollout_ratios(plugin, mask).items():
                value, grad, _ = self.loss_and_gradient(
                    plugin, logps, old, advantages, mask, level, rollout_ratio=ratio
                )
                where = f"{policy}, {level}-level weights, {correction}"
                assert torch.isfinite(value), f"loss is {value.item()} ({where})"
                assert torch.isfinite(grad).all(), f"gradient has non-finite values ({where}): {grad}"
                assert grad.abs().sum() > 0, f"the loss has a zero gradient ({where}): it trains nothing"

    @pytest.mark.parametrize("level", [TOKEN, SEQUENCE])
    def test_a_completion_with_no_active_tokens_keeps_everything_finite(self, plugin, level):
        """algorithm.mask_truncated_completions zeroes a truncated completion's whole mask."""
        logps, mask, advantages = random_completions(seed=2, lengths=(4, 0, 2, 3))
        old = logps + 0.1
        value, grad, _ = self.loss_and_gradient(plugin, logps, old, advantages, mask, level)
        assert torch.isfinite(value) and torch.isfinite(grad).all(), f"loss {value.item()}, gradient {grad}"
        assert (grad[1] == 0).all(), "a completion with no active tokens must get no gradient"

    @pytest.mark.parametrize("level", [TOKEN, SEQUENCE])
    def test_masked_tokens_change_neither_loss_nor_gradient_nor_metrics(self, plugin, level):
        logps, mask, advantages = random_completions(seed=3)
        old = logps + torch.randn(logps.shape, generator=torch.Generator().manual_seed(4)) * 0.2
        padding = mask == 0
        for correction, ratio in self.rollout_ratios(plugin, mask).items():
            results = []
            for pad_logp, pad_old, pad_ratio in ((-0.1, -0.2, 1.0), (-30.0, -1.0, 7.0)):
                padded_ratio = ratio
                if ratio is not None and ratio.shape == mask.shape:
                    padded_ratio = ratio.masked_fill(padding, pad_ratio)
                results.append(
                    self.loss_and_gradient(
                        plugin,
                        logps.masked_fill(padding, pad_logp),
                        old.masked_fill(padding, pad_old),
                        advantages,
                        mask,
                        level,
                        rollout_ratio=padded_ratio,
                    )
                )
            (loss_a, grad_a, metrics_a), (loss_b, grad_b, metrics_b) = results
            where = f"{level}-level weights, {correction}"
            assert_close(loss_a, loss_b, what=f"padding changed the loss ({where})")
            assert_close(grad_a, grad_b, what=f"padding changed the gradient ({where})")
            assert (grad_a[padding] == 0).all(), f"padding tokens got a gradient ({where})"
            for name in metrics_a:
                assert_close(
                    metrics_a[name], metrics_b[name], equal_nan=True, what=f"padding changed metric {name!r} ({where})"
                )

    @pytest.mark.parametrize("level", [TOKEN, SEQUENCE])
    def test_on_policy_gradient_favours_positive_advantages(self, plugin, level):
        """At pi_theta = pi_old, gradient descent raises the log-probs of tokens with a positive advantage and
        lowers those with a negative one: the sign error this catches is the commonest bug of a new loss."""
        logps, mask, advantages = random_completions(seed=5)
        _, grad, _ = self.loss_and_gradient(plugin, logps, logps, advantages, mask, level)
        descent = -grad * advantages * mask  # > 0 where a step moves the log-prob the advantage's way
        assert (descent >= -1e-8).all(), f"the gradient pushes some tokens against their advantage's sign: {grad}"
        assert (descent > 0).any(), "on-policy, the loss gives no token a gradient"

    def test_metrics_are_scalar_tensors(self, plugin):
        logps, mask, advantages = random_completions(seed=6)
        _, _, metrics = self.loss_and_gradient(plugin, logps, logps + 0.1, advantages, mask, TOKEN)
        missing = set(self.required_metrics) - set(metrics)
        assert not missing, f"required metrics missing: {sorted(missing)} (it reported {sorted(metrics)})"
        for name, value in metrics.items():
            # The trainer gathers each metric across processes and averages it: a 0-dim tensor, NaN allowed.
            assert isinstance(value, torch.Tensor) and value.dim() == 0, f"metric {name!r} is not a scalar tensor"

    @pytest.mark.parametrize("level", [TOKEN, SEQUENCE])
    def test_gradient_is_the_same_whole_or_accumulated(self, plugin, level):
        if not declared(plugin, "loss", "accumulation_invariant"):
            pytest.skip("the loss does not declare accumulation_invariant=True")
        logps, mask, advantages = random_completions(seed=8, lengths=(6, 3, 1, 5, 2, 6))
        old = logps + torch.randn(logps.shape, generator=torch.Generator().manual_seed(9)) * 0.3
        total_tokens = float(mask.sum())  # num_items_in_batch: the whole generation batch
        in_order = torch.arange(logps.shape[0])
        by_length = mask.sum(-1).argsort(stable=True)  # as trainer.group_by_length splits a batch

        def accumulated_gradient(order: torch.Tensor, chunks: int) -> torch.Tensor:
            leaf = logps.clone().requires_grad_()
            for rows in order.chunk(chunks):
                value, _ = self.evaluate(
                    plugin,
                    leaf[rows],
                    old[rows],
                    advantages[rows],
                    mask[rows],
                    level,
                    accumulation=chunks,
                    num_items_in_batch=total_tokens,
                )
                value.backward()
            return leaf.grad

        whole = accumulated_gradient(in_order, 1)
        for order_name, order in (("in order", in_order), ("grouped by length", by_length)):
            for chunks in (2, 3):
                assert_close(
                    accumulated_gradient(order, chunks),
                    whole,
                    what=f"{chunks} equal micro-batches ({order_name}) give another gradient than the whole batch",
                )
