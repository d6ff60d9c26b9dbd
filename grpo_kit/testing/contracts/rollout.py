"""The custom-rollout suite (grpo_kit/contract/kinds.py: CustomRollout, `+rollout=NAME`)."""

from collections.abc import Sequence
from typing import ClassVar

import pytest

from grpo_kit.plugins.registry import Registry
from grpo_kit.testing.contracts.plugin import PluginContract


class RolloutContract(PluginContract):
    """A custom rollout (kinds.py: CustomRollout, `+rollout=NAME`) on the embedded tokenizer and a tiny random model
    behind the transformers backend: one result per row, lists that agree in length, token ids of the vocabulary."""

    kind = "rollout"
    rows: ClassVar[Sequence[dict]] = tuple({"prompt": prompt, "solution": "3"} for prompt in ("1+2=", "0+3=") * 4)

    @pytest.fixture(scope="class")
    @classmethod
    def result(cls, plugin, tmp_path_factory):
        from accelerate import Accelerator
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from grpo_kit.testing.models import build_tiny_model

        directory = build_tiny_model(tmp_path_factory.mktemp("rollout-contract-model"))
        model, tokenizer = AutoModelForCausalLM.from_pretrained(directory), AutoTokenizer.from_pretrained(directory)
        generation = Registry().build("generation", "transformers", {"max_completion_length": 6})
        generation.start(model, tokenizer, Accelerator(cpu=True))
        try:
            return plugin(list(cls.rows), tokenizer, generation), tokenizer
        finally:
            generation.close()

    def test_one_result_per_row(self, result):
        result, _ = result
        n = len(self.rows)
        assert len(result.prompt_ids) == n and len(result.completion_ids) == n, (
            f"{len(result.prompt_ids)} prompts and {len(result.completion_ids)} completions for {n} rows"
        )
        for name, values in result.columns.items():
            assert len(values) == n, f"column {name!r} has {len(values)} values for {n} rows"

    def test_per_token_lists_match_the_completions(self, result):
        result, tokenizer = result
        for field_name in ("logprobs", "env_mask"):
            values = getattr(result, field_name)
            if values is not None:
                lengths = [len(v) for v in values], [len(ids) for ids in result.completion_ids]
                assert lengths[0] == lengths[1], f"{field_name}: lengths {lengths[0]} for completions of {lengths[1]}"
        vocabulary = len(tokenizer)
        for ids in [*result.prompt_ids, *result.completion_ids]:
            assert all(isinstance(i, int) and 0 <= i < vocabulary for i in ids), f"not token ids: {ids}"
