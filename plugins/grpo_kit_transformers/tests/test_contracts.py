"""The transformers generation backend against the conformance kit (grpo_kit.testing.contracts)."""

from grpo_kit.testing.contracts import GenerationContract, assert_contracts_cover


class TestTransformersGeneration(GenerationContract):
    plugin_name = "transformers"


def test_every_backend_is_checked():
    assert_contracts_cover("grpo-kit-transformers", globals())
