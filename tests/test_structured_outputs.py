"""generation.structured_outputs_regex (TRL's vllm_structured_outputs_regex): taken by the backends that declare
`structured_outputs`, refused by the others and by a custom rollout, when the run is composed. The request field
itself is tested with the vLLM plugin (plugins/grpo_kit_vllm/tests)."""

import pytest

import grpo_kit
from grpo_kit.contract.errors import ConfigError
from grpo_kit.plugins.registry import Registry, plugin_manager
from grpo_kit.testing import tiny_run

REGEX = "generation.structured_outputs_regex='[0-9]+'"
FIXED_ROLLOUT = """
    import grpo_kit
    from grpo_kit.contract.kinds import RolloutResult

    class Fixed:
        def __init__(self, config):
            pass

        def __call__(self, rows, tokenizer, generation):
            return RolloutResult([[1]] * len(rows), [[2]] * len(rows))

    @grpo_kit.hookimpl
    def register_rollouts(register):
        register("fixed", Fixed)
"""


def test_a_backend_that_cannot_constrain_its_sampling_is_refused_naming_those_that_can(tiny_model):
    message = (
        r"generation=transformers cannot keep its samples within a regular expression .* "
        r"Use generation=vllm_colocate or generation=vllm_server"
    )
    with pytest.raises(ConfigError, match=message):
        grpo_kit.compose(tiny_run(tiny_model, "+reward=accuracy", "generation=transformers", REGEX))


@pytest.mark.parametrize("backend", ["vllm_server", "vllm_colocate"])
def test_vllm_backends_take_the_regex(tiny_model, backend):
    cfg = grpo_kit.compose(tiny_run(tiny_model, "+reward=accuracy", f"generation={backend}", REGEX))
    assert cfg.generation.structured_outputs_regex == "[0-9]+"


def test_a_custom_rollout_is_refused_since_it_samples_by_itself(local_plugin, tiny_model):
    registry = Registry(plugin_manager(local_modules=[local_plugin("fixed_rollout", FIXED_ROLLOUT)]))
    overrides = tiny_run(tiny_model, "+reward=accuracy", "+rollout=fixed", "generation=vllm_server", REGEX)
    with pytest.raises(ConfigError, match=r"\+rollout=fixed generates the completions itself"):
        grpo_kit.compose(overrides, registry)
