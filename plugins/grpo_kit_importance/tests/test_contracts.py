"""Every built-in importance-sampling level and rollout correction against the conformance kit."""

from grpo_kit.testing.contracts import ImportanceSamplingContract, RolloutCorrectionContract, assert_contracts_cover


class TestImportanceSamplingLevels(ImportanceSamplingContract):
    plugin_names = ("token", "sequence")


class TestRolloutCorrections(RolloutCorrectionContract):
    plugin_names = ("none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def test_every_plugin_is_checked():
    assert_contracts_cover("grpo-kit-importance", globals())
