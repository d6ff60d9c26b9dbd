"""The rollout-correction suite (grpo_kit/contract/kinds.py: RolloutCorrection)."""

import math

import torch

from grpo_kit.testing.contracts.checks import SEQUENCE, TOKEN, assert_close, random_completions
from grpo_kit.testing.contracts.plugin import PluginContract


class RolloutCorrectionContract(PluginContract):
    """A rollout correction (kinds.py: RolloutCorrection): the ratio pi_old / pi_sampler, or None for none."""

    kind = "rollout_correction"

    def inputs(self, seed=0, spread=0.5):
        old, mask, _ = random_completions(seed)
        sampling = old + torch.randn(old.shape, generator=torch.Generator().manual_seed(seed + 1)) * spread
        return old, sampling, mask

    def test_level_and_shape(self, plugin):
        assert plugin.level in (None, TOKEN, SEQUENCE), "level must be None, 'token' or 'sequence'"
        old, sampling, mask = self.inputs()
        ratio = plugin.ratio(old, sampling, mask)
        if plugin.level is None:
            assert ratio is None, "a correction of level None returns None (no correction)"
            return
        assert ratio is not None, f"a {plugin.level}-level correction must return a ratio, not None"
        expected = tuple(mask.shape) if plugin.level == TOKEN else (mask.shape[0], 1)
        assert tuple(ratio.shape) == expected, f"a {plugin.level}-level ratio has shape {expected}, got {ratio.shape}"

    def test_ratio_is_finite_and_non_negative(self, plugin):
        for spread in (0.1, 3.0):  # a close sampler and a far one
            ratio = plugin.ratio(*self.inputs(seed=2, spread=spread))
            if ratio is not None:
                assert torch.isfinite(ratio).all() and (ratio >= 0).all(), f"ratio {ratio}"

    def test_agreeing_sampler_needs_no_correction(self, plugin):
        old, _, mask = self.inputs(seed=3)
        ratio = plugin.ratio(old, old.clone(), mask)
        if ratio is not None:
            active = ratio[mask.bool()] if ratio.shape == mask.shape else ratio
            assert_close(active, torch.ones_like(active), what="sampler == trainer")

    def test_masked_tokens_do_not_matter(self, plugin):
        old, sampling, mask = self.inputs(seed=4)
        padding = mask == 0
        a = plugin.ratio(old.masked_fill(padding, -0.5), sampling.masked_fill(padding, -0.5), mask)
        b = plugin.ratio(old.masked_fill(padding, -9.0), sampling.masked_fill(padding, -0.1), mask)
        if a is None:
            assert b is None
            return
        if a.shape == mask.shape:
            a, b = a * mask, b * mask
        assert_close(a, b, what="padding changed the active ratios")

    def test_a_token_the_sampler_did_not_score_keeps_the_ratio_finite(self, plugin):
        old, sampling, mask = self.inputs(seed=5)
        sampling[0, 0] = math.nan  # a backend may report NaN for a log-prob it could not compute
        ratio = plugin.ratio(old, sampling, mask)
        assert ratio is None or torch.isfinite(ratio).all(), f"ratio {ratio}"
