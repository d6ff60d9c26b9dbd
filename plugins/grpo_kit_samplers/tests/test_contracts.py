"""Every built-in sampler against the conformance kit (grpo_kit.testing.contracts)."""

from grpo_kit.testing.contracts import SamplerContract, assert_contracts_cover


class TestUniform(SamplerContract):
    plugin_name = "uniform"


class TestDifficultyPool(SamplerContract):
    plugin_name = "difficulty_pool"


class TestCurriculum(SamplerContract):
    plugin_name = "curriculum"
    options = {"column": "difficulty", "full_after": 40}


class TestSkipFlatGroups(SamplerContract):
    plugin_name = "skip_flat_groups"


def test_every_sampler_is_checked():
    assert_contracts_cover("grpo-kit-samplers", globals())
