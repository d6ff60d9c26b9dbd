"""Every built-in hook plugin against the conformance kit (grpo_kit.testing.contracts)."""

from grpo_kit.testing.contracts import HookContract, assert_contracts_cover


class TestDynamicSampling(HookContract):
    plugin_name = "dynamic_sampling"


def test_every_hook_plugin_is_checked():
    assert_contracts_cover("grpo-kit-hooks", globals())
