import torch

from grpo_kit_importance.no_correction import NoCorrection
from grpo_kit_importance.token import TokenLevel


def test_token_level_weights_are_the_per_token_log_ratios():
    log_ratio = torch.tensor([[0.1, -0.2], [0.3, 0.0]])
    assert torch.equal(TokenLevel(None).log_weights(log_ratio, torch.ones(2, 2)), log_ratio)


def test_no_correction_gives_no_ratio():
    logps = torch.zeros(2, 3)
    assert NoCorrection(None).ratio(logps, logps - 0.1, torch.ones(2, 3)) is None
