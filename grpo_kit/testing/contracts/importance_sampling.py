"""The importance-sampling suite (grpo_kit/contract/kinds.py: ImportanceSampling)."""

import torch

from grpo_kit.testing.contracts.checks import SEQUENCE, TOKEN, assert_close, random_completions
from grpo_kit.testing.contracts.plugin import PluginContract


class ImportanceSamplingContract(PluginContract):
    """An importance-sampling level (kinds.py: ImportanceSampling): log weights from log(pi_theta / pi_old)."""

    kind = "importance_sampling"

    def inputs(self, seed=0):
        logps, mask, _ = random_completions(seed)
        log_ratio = torch.randn(logps.shape, generator=torch.Generator().manual_seed(seed + 1)) * 0.3
        return log_ratio, mask

    def expected_shape(self, plugin, mask) -> tuple[int, int]:
        return tuple(mask.shape) if plugin.level == TOKEN else (mask.shape[0], 1)

    def test_level_and_shape(self, plugin):
        assert plugin.level in (TOKEN, SEQUENCE), f"level must be 'token' or 'sequence', got {plugin.level!r}"
        log_ratio, mask = self.inputs()
        weights = plugin.log_weights(log_ratio, mask)
        expected = self.expected_shape(plugin, mask)
        assert tuple(weights.shape) == expected, f"{plugin.level}-level weights: shape {expected}, got {weights.shape}"
        assert torch.isfinite(weights).all()

    def test_weights_carry_the_gradient(self, plugin):
        log_ratio, mask = self.inputs(seed=2)
        leaf = log_ratio.clone().requires_grad_()
        weights = plugin.log_weights(leaf, mask)
        assert weights.requires_grad, "the log weights must keep the log-ratio's gradient: the loss trains through them"
        (weights * torch.linspace(0.5, 1.5, mask.shape[0]).unsqueeze(1)).sum().backward()
        assert leaf.grad is not None and torch.isfinite(leaf.grad).all(), "no finite gradient reaches the log-ratio"
        assert (leaf.grad * mask).abs().sum() > 0, "the weights do not depend on the active tokens' log-ratios"

    def test_on_policy_weights_are_one(self, plugin):
        _, mask = self.inputs()
        weights = plugin.log_weights(torch.zeros(mask.shape), mask)
        active = weights * mask if plugin.level == TOKEN else weights
        assert torch.allclose(active, torch.zeros_like(active)), "log(pi_theta / pi_old) = 0 must give log weight 0"

    def test_masked_tokens_do_not_matter(self, plugin):
        log_ratio, mask = self.inputs(seed=4)
        padding = mask == 0
        a = plugin.log_weights(log_ratio.masked_fill(padding, 0.0), mask)
        b = plugin.log_weights(log_ratio.masked_fill(padding, 25.0), mask)
        if plugin.level == TOKEN:
            a, b = a * mask, b * mask
        assert_close(a, b, what="padding changed the active weights")

    def test_a_completion_with_no_active_tokens_keeps_weights_finite(self, plugin):
        log_ratio, _ = self.inputs(seed=6)
        mask = torch.ones(log_ratio.shape)
        mask[1] = 0
        assert torch.isfinite(plugin.log_weights(log_ratio, mask)).all()
