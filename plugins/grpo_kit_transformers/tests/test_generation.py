"""Generation on a tiny random model: completions are cut after the first EOS and flagged when truncated."""

import pytest
import torch
from accelerate import Accelerator
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_kit_transformers.generation import TransformersGeneration, TransformersGenerationConfig


def start(tiny_model, **options):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    generation = TransformersGeneration(TransformersGenerationConfig(**options))
    generation.start(model, tokenizer, Accelerator(cpu=True))
    return generation, tokenizer


def test_masks_stop_at_the_first_eos(tiny_model):
    torch.manual_seed(0)
    generation, tokenizer = start(tiny_model, max_completion_length=6, temperature=3.0)
    prompt_ids = [tokenizer("1+2=").input_ids, tokenizer("34+5=").input_ids] * 16
    out = generation.generate(prompt_ids)
    assert out.completion_ids.shape[0] == 32 and out.completion_ids.shape[1] <= 6
    for ids, mask, truncated in zip(out.completion_ids, out.completion_mask, out.is_truncated):
        eos = (ids == tokenizer.eos_token_id).nonzero()
        if len(eos) == 0:  # cut off, unless its last token happens to be the pad token (as TRL counts)
            assert mask.all() and bool(truncated) == (ids[-1] != tokenizer.pad_token_id)
        else:
            end = eos[0].item()
            assert mask[: end + 1].all() and not mask[end + 1 :].any() and not truncated
            assert (ids[end + 1 :] == tokenizer.pad_token_id).all()
    assert out.is_truncated.any() and not out.is_truncated.all()  # a hot random model does both


def test_greedy_sampling_settings_reach_generate(tiny_model):
    generation, tokenizer = start(tiny_model, max_completion_length=3, top_k=1)
    prompt_ids = [tokenizer("1+2=").input_ids] * 4
    out = generation.generate(prompt_ids)
    assert (out.completion_ids == out.completion_ids[0]).all()  # top_k=1 is greedy


@pytest.mark.parametrize("loop", ["lean", "static", "generate"])
def test_generation_kwargs_override_the_settings_the_backend_sets(tiny_model, loop):
    # As TRL applies them: last, over its own max_new_tokens, top_k, ... (a repeated keyword was a TypeError).
    no_eos = [AutoTokenizer.from_pretrained(tiny_model).eos_token_id]  # every completion runs to the limit
    generation, tokenizer = start(
        tiny_model,
        loop=loop,
        max_completion_length=6,
        temperature=3.0,
        generation_kwargs={"max_new_tokens": 2, "top_k": 1, "suppress_tokens": no_eos},
    )
    assert generation.generation_config.max_new_tokens == 2 and generation.generation_config.top_k == 1
    out = generation.generate([tokenizer("1+2=").input_ids] * 8)
    assert out.completion_ids.shape == (8, 2)  # max_new_tokens=2, not 6
    assert (out.completion_ids == out.completion_ids[0]).all()  # top_k=1: greedy, however hot


def test_generate_gathers_each_tokens_log_prob_as_its_scores_give_it(tiny_model):
    """The sampler's log-probs of `generate`, gathered at each step (no (N, T, V) scores kept), are those of the
    scores `generate` returns when asked for them all."""
    generation, tokenizer = start(tiny_model, loop="generate", max_completion_length=8, temperature=1.3, top_k=6)
    prompt_ids = [tokenizer("1+2=").input_ids, tokenizer("34+5=").input_ids] * 8
    torch.manual_seed(0)
    out = generation.generate(prompt_ids, with_logprobs=True)
    assert not generation.generation_config.output_scores
    prompts = tokenizer.pad({"input_ids": prompt_ids}, padding_side="left", return_tensors="pt")
    torch.manual_seed(0)
    reference = generation.model.generate(**prompts, generation_config=generation.generation_config, output_scores=True)
    ids = reference.sequences[:, prompts.input_ids.shape[1] :]
    assert torch.equal(ids.masked_fill(out.completion_mask == 0, tokenizer.pad_token_id), out.completion_ids)
    expected = torch.stack(reference.scores, dim=1).log_softmax(-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    expected = expected.masked_fill(out.completion_mask == 0, 0.0)
    torch.testing.assert_close(out.sampling_per_token_logps, expected, atol=1e-6, rtol=0)
    assert (out.completion_mask.sum(1) < 8).any(), "some completions should end early"
