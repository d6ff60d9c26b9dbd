"""Every built-in environment against the conformance kit (grpo_kit.testing.contracts)."""

from grpo_kit.testing.contracts import EnvironmentContract, assert_contracts_cover


class TestCalculator(EnvironmentContract):
    plugin_name = "calculator"
    tool_calls = [("add", {"a": 12, "b": 30}), ("multiply", {"a": 6, "b": 7})]


def test_every_environment_is_checked():
    assert_contracts_cover("grpo-kit-environments", globals())
