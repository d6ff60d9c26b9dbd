"""Every built-in advantage estimator against the conformance kit (grpo_kit.testing.contracts)."""

from grpo_kit.testing.contracts import AdvantageContract, assert_contracts_cover


class TestAdvantageEstimators(AdvantageContract):
    plugin_names = ("group", "batch", "none", "gdpo", "rloo")


def test_every_estimator_is_checked():
    assert_contracts_cover("grpo-kit-advantages", globals())
