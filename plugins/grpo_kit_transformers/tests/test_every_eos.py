"""Every EOS id of the model's generation config ends a completion, in every loop, and a completion is truncated
as TRL counts it: its last token is neither an EOS nor the pad token."""

import pytest
import torch
from accelerate import Accelerator
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_kit_transformers.generation import TransformersGeneration, TransformersGenerationConfig


def start(tiny_model, eos_token_ids=None, **options):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    if eos_token_ids is not None:  # as Qwen2.5/Qwen3 Instruct's generation config lists two
        model.generation_config.eos_token_id = eos_token_ids
    generation = TransformersGeneration(TransformersGenerationConfig(**options))
    generation.start(model, tokenizer, Accelerator(cpu=True))
    return generation, tokenizer


@pytest.mark.parametrize("loop", ["lean", "static", "generate"])
def test_no_mask_runs_past_any_eos_of_the_generation_config(tiny_model, loop):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    other_eos = tokenizer.convert_tokens_to_ids("5")
    eos = [tokenizer.eos_token_id, other_eos]
    generation, _ = start(tiny_model, eos, loop=loop, max_completion_length=8, temperature=3.0)
    torch.manual_seed(0)
    out = generation.generate([tokenizer("1+2=").input_ids, tokenizer("34+5=").input_ids] * 32)
    ended_by_the_other = 0
    for ids, mask, truncated in zip(out.completion_ids, out.completion_mask, out.is_truncated):
        length = int(mask.sum())
        assert mask[:length].all(), "the mask is a prefix"
        written = ids[:length].tolist()
        assert not set(written[:-1]) & set(eos), f"the mask runs past an EOS: {written}"
        assert (ids[length:] == tokenizer.pad_token_id).all()
        assert bool(truncated) == (written[-1] not in [*eos, tokenizer.pad_token_id])
        ended_by_the_other += written[-1] == other_eos
    assert ended_by_the_other > 0, "hot sampling should end some completions at the generation config's other EOS"


@pytest.mark.parametrize("loop", ["lean", "static", "generate"])
def test_a_completion_that_ends_in_a_sampled_pad_token_is_not_truncated(tiny_model, loop):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    only_pad = [token for token in range(len(tokenizer)) if token != tokenizer.pad_token_id]
    generation, _ = start(
        tiny_model, loop=loop, max_completion_length=3, generation_kwargs={"suppress_tokens": only_pad}
    )
    out = generation.generate([tokenizer("1+2=").input_ids] * 4)
    assert out.completion_ids.tolist() == [[tokenizer.pad_token_id] * 3] * 4  # no EOS: it ran to the limit
    assert out.completion_mask.all() and not out.is_truncated.any()  # but its last token is the pad token, as in TRL
