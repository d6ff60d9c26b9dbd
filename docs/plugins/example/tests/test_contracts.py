"""Every plugin of this distribution against grpo_kit's conformance kit: what the core relies on.

Run it after installing the distribution: `pip install -e . && python -m pytest tests`.
"""

from grpo_kit.testing.contracts import (
    AdvantageContract,
    HookContract,
    LossContract,
    RewardContract,
    SamplerContract,
    assert_contracts_cover,
)


class TestGPGLoss(LossContract):
    plugin_name = "gpg"
    required_metrics = ("gpg/nonzero_advantage_share",)
    # GPG's registration declares accumulation_invariant=True, so the kit checks it.


class TestGPGAdvantage(AdvantageContract):
    plugin_name = "gpg"


class TestGPGAdvantageLikeGRPO(AdvantageContract):
    plugin_name = "gpg"
    options = {"gradient_correction": False, "normalize_by_std": True}


class TestRegexFormat(RewardContract):
    plugin_name = "regex_format"


class TestRegexFormatAnywhere(RewardContract):
    plugin_name = "regex_format"
    options = {"pattern": r"\d", "full_match": False}


class TestRewardTarget(HookContract):
    plugin_name = "reward_target"


class TestFailureReplay(SamplerContract):
    plugin_name = "failure_replay"


def test_every_plugin_is_checked():
    assert_contracts_cover("grpo-kit-example", globals())
