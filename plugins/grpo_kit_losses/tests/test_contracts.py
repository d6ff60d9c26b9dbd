"""Every built-in loss against the conformance kit (grpo_kit.testing.contracts)."""

from grpo_kit.testing.contracts import LossContract, assert_contracts_cover

CLIPPED_METRICS = (
    "clip_ratio/low_mean",
    "clip_ratio/high_mean",
    "clip_ratio/region_mean",
    "clip_ratio/low_min",
    "clip_ratio/high_max",
)


class TestClippedLosses(LossContract):
    plugin_names = ("grpo", "dr_grpo", "dapo", "luspo")
    required_metrics = CLIPPED_METRICS


class TestBNPO(LossContract):
    """bnpo divides by the micro-batch's own active tokens (as TRL does), so the split changes its gradient: it
    declares accumulation_invariant = False, and the kit skips that check."""

    plugin_name = "bnpo"
    required_metrics = CLIPPED_METRICS


class TestCISPO(LossContract):
    plugin_name = "cispo"
    required_metrics = ("cispo_clip_ratio",)


class TestSAPO(LossContract):
    plugin_name = "sapo"


class TestVESPO(LossContract):
    plugin_name = "vespo"
    required_metrics = ("vespo/phi_seq_mean",)


def test_every_loss_is_checked():
    assert_contracts_cover("grpo-kit-losses", globals())
