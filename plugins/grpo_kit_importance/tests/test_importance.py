"""Importance-sampling levels and rollout corrections, with expected values worked out by hand."""

import math

import pytest
import torch

import grpo_kit
from grpo_kit_importance.configs import CorrectionConfig
from grpo_kit_importance.no_correction import NoCorrection
from grpo_kit_importance.sequence import SequenceLevel
from grpo_kit_importance.token import TokenLevel

MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
LOG_RATIO = torch.tensor([[0.3, -0.6, 0.9], [0.2, 5.0, 5.0]])


def test_token_level_weights_are_the_token_log_ratios():
    assert torch.equal(TokenLevel().log_weights(LOG_RATIO, MASK), LOG_RATIO)


def test_sequence_level_weight_is_the_mean_log_ratio_of_active_tokens():
    weights = SequenceLevel().log_weights(LOG_RATIO, MASK)
    torch.testing.assert_close(weights, torch.tensor([[0.2], [0.2]]))  # (0.3 - 0.6 + 0.9) / 3; padding ignored


def correction(name: str, **bounds):
    """The installed rollout correction `name`, built as a run builds it: its level comes with its registration."""
    return grpo_kit.Registry().build("rollout_correction", name, CorrectionConfig(**bounds))


# old - sampling per token: [ln 2, ln 0.5, ln 4] and [ln 8, (padding)]
OLD = torch.log(torch.tensor([[0.4, 0.1, 0.8], [0.8, 0.3, 0.3]]))
SAMPLING = torch.log(torch.tensor([[0.2, 0.2, 0.2], [0.1, 0.9, 0.9]]))


def test_token_truncate_clamps_each_ratio():
    ratio = correction("token_truncate", min=0.6, max=3.0).ratio(OLD, SAMPLING, MASK)
    torch.testing.assert_close(ratio, torch.tensor([[2.0, 0.6, 3.0], [3.0, 1.0, 1.0]]))


def test_token_mask_zeroes_ratios_out_of_bounds():
    ratio = correction("token_mask", min=0.6, max=3.0).ratio(OLD, SAMPLING, MASK)
    torch.testing.assert_close(ratio, torch.tensor([[2.0, 0.0, 0.0], [0.0, 1.0, 1.0]]))


def test_sequence_corrections_use_the_product_over_the_sequence():
    # products: 2 * 0.5 * 4 = 4 and 8
    truncated = correction("sequence_truncate", max=5.0).ratio(OLD, SAMPLING, MASK)
    torch.testing.assert_close(truncated, torch.tensor([[4.0], [5.0]]))
    masked = correction("sequence_mask", max=5.0).ratio(OLD, SAMPLING, MASK)
    torch.testing.assert_close(masked, torch.tensor([[4.0], [0.0]]))


def test_an_unscored_sampler_token_gets_no_correction():
    sampling = SAMPLING.clone()
    sampling[0, 0] = math.nan
    ratio = correction("token_truncate", max=3.0).ratio(OLD, sampling, MASK)
    assert ratio[0, 0].item() == 1.0


def test_bounds_are_checked():
    with pytest.raises(ValueError, match="rollout_correction.min=3.0 must be below rollout_correction.max=2.0"):
        correction("token_mask", min=3.0, max=2.0)
    with pytest.raises(ValueError, match="needs a bound"):
        correction("sequence_truncate", min=None, max=None)
    assert correction("token_mask", min=None, max=None).ratio(OLD, SAMPLING, MASK).gt(0).all()


def test_no_correction_gives_no_ratio():
    assert NoCorrection().ratio(OLD, SAMPLING, MASK) is None
