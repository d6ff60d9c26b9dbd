"""The lean sampling loop samples what `model.generate` samples.

Four checks, each able to catch a different mistake:
- while no row has ended, with the same seed, its tokens are `generate`'s, bit for bit, and their log-probs too up
  to the float rounding of the new token's attention, under every sampling setting (a wrong processor, order or
  position numbering changes them);
- that attention (`decode_attention`, on the CPU) gives SDPA's values up to float rounding, with and without
  padding and grouped heads;
- once rows end and leave the batch, every log-prob it returns is the one a fresh forward pass over that row's own
  prefix gives, after the same processors (a row mixed up with another, or a cache gone stale, would not be);
- over many samples, its completion lengths follow `generate`'s distribution (a chi-square test), and so do the
  static loop's on CUDA.
"""

import copy
import math
import warnings

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from grpo_kit_transformers.sampling import (
    DECODE_ATTENTION,
    attention_for_sampling,
    decode_attention,
    logits_processors,
    prepared,
    sample,
    why_not_lean,
)
from grpo_kit_transformers.static import StaticDecoder

SETTINGS = [
    dict(temperature=1.0),
    dict(temperature=0.7, top_k=5),
    dict(temperature=1.3, top_p=0.8),
    dict(temperature=1.0, min_p=0.1),
    dict(temperature=0.9, repetition_penalty=1.3, top_k=8, top_p=0.95),
]


@pytest.fixture(scope="module")
def model_and_prompts(tiny_model):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model).eval()
    texts = ["1+2=", "34+5=", "7+77=", "9="] * 8  # prompts of different lengths, left-padded
    prompts = tokenizer.pad(
        {"input_ids": [tokenizer(t).input_ids for t in texts]}, padding_side="left", return_tensors="pt"
    )
    return model, tokenizer, prompts


def config(tokenizer, max_new_tokens, **settings):
    return GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        disable_compile=True,
        return_dict_in_generate=True,
        **{"top_k": 0, **settings},
    )


@pytest.mark.parametrize("settings", SETTINGS)
def test_while_no_row_has_ended_it_samples_the_tokens_generate_samples(model_and_prompts, settings):
    model, tokenizer, prompts = model_and_prompts
    generation_config = config(tokenizer, 12, suppress_tokens=[tokenizer.eos_token_id], **settings)
    torch.manual_seed(3)
    out = model.generate(**prompts, generation_config=generation_config, output_scores=True)
    torch.manual_seed(3)
    ids, logps = sample(model, prompts["input_ids"], prompts["attention_mask"], generation_config, with_logprobs=True)
    assert torch.equal(ids, out.sequences[:, prompts["input_ids"].shape[1] :])
    expected = torch.stack(out.scores, dim=1).log_softmax(-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(logps, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
@pytest.mark.parametrize("mask", ["none", "bool", "float"])
def test_the_attention_of_a_new_token_is_sdpas(kv_heads, mask):
    generator = torch.Generator().manual_seed(kv_heads)
    batch, heads, length, dim = 6, 4, 37, 16
    query = torch.randn(batch, heads, 1, dim, generator=generator)
    keys = torch.randn(batch, kv_heads, dim, length + 5, generator=generator)[..., :length].transpose(-1, -2)
    values = torch.randn(batch, kv_heads, length, dim, generator=generator)
    padding = torch.arange(length) >= torch.tensor([0, 3, 0, 7, 1, 0]).unsqueeze(1)  # (B, T): left padding
    attention_mask = {
        "none": None,
        "bool": padding[:, None, None, :],
        "float": torch.zeros(batch, 1, 1, length).masked_fill(~padding[:, None, None, :], torch.finfo(torch.float).min),
    }[mask]
    module = torch.nn.Module()
    module.num_key_value_groups = heads // kv_heads
    out, _ = decode_attention(module, query, keys, values, attention_mask, scaling=0.3)  # (B, 1, H, D)
    expected = torch.nn.functional.scaled_dot_product_attention(
        query,
        keys.repeat_interleave(heads // kv_heads, 1),
        values.repeat_interleave(heads // kv_heads, 1),
        attn_mask=attention_mask,
        scale=0.3,
    ).transpose(1, 2)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)


def test_a_cpu_model_on_sdpa_samples_with_decode_attention_and_gets_its_own_back(model_and_prompts):
    model, tokenizer, prompts = model_and_prompts
    assert model.config._attn_implementation == "sdpa"
    seen = []
    hook = model.model.layers[0].self_attn.register_forward_pre_hook(
        lambda module, args: seen.append(module.config._attn_implementation)
    )
    try:
        sample(model, prompts["input_ids"], prompts["attention_mask"], config(tokenizer, 3))
    finally:
        hook.remove()
    assert seen == [DECODE_ATTENTION] * 3 and model.config._attn_implementation == "sdpa"
    model.config._attn_implementation = "eager"
    try:
        with attention_for_sampling(model) as transposed_keys:
            assert not transposed_keys and model.config._attn_implementation == "eager"
    finally:
        model.config._attn_implementation = "sdpa"


@pytest.mark.parametrize("settings", SETTINGS)
def test_rows_that_leave_the_batch_leave_the_others_log_probs_exact(model_and_prompts, settings):
    model, tokenizer, prompts = model_and_prompts
    generation_config = config(tokenizer, 16, **settings)
    torch.manual_seed(5)
    ids, logps = sample(model, prompts["input_ids"], prompts["attention_mask"], generation_config, with_logprobs=True)
    is_eos = ids == tokenizer.eos_token_id
    ended_at = torch.where(is_eos.any(1), is_eos.int().argmax(1), ids.shape[1])  # (B,)
    assert (ended_at < ids.shape[1] - 1).sum() >= 4, "too few rows ended early for the test to mean anything"

    processors = logits_processors(model, prepared(model, generation_config, "cpu"), prompts["input_ids"].shape[1])
    sequences = torch.cat([prompts["input_ids"], ids], dim=1)
    mask = torch.cat([prompts["attention_mask"], torch.ones_like(ids)], dim=1)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=sequences, attention_mask=mask, position_ids=positions).logits.float()
    prompt_length = prompts["input_ids"].shape[1]
    for t in range(ids.shape[1]):
        scores = processors(sequences[:, : prompt_length + t], logits[:, prompt_length + t - 1].clone())
        expected = scores.log_softmax(-1).gather(-1, ids[:, t : t + 1]).squeeze(1)
        sampled = ended_at >= t  # rows that had not ended before position t
        torch.testing.assert_close(logps[sampled, t], expected[sampled], atol=1e-4, rtol=1e-4)


CUDA = pytest.param(
    "cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
)


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("loop", ["lean", "static"])
def test_completion_lengths_follow_generates_distribution(model_and_prompts, loop, device):
    """On a CPU the static loop draws `generate`'s very tokens (tests/test_static.py); on CUDA, where multinomial has
    a kernel of its own and the static loop replays a CUDA graph, the same distribution is what there is to check."""
    model, tokenizer, prompts = model_and_prompts
    model = copy.deepcopy(model).to(device)
    generation_config = config(tokenizer, 6, temperature=2.0)
    batch = {name: tensor.repeat(16, 1).to(device) for name, tensor in prompts.items()}  # 512 rows
    draw = sample if loop == "lean" else StaticDecoder().sample

    def lengths(draw):
        counts = torch.zeros(7)
        for seed in range(8):
            torch.manual_seed(seed)
            ids = draw().cpu()
            is_eos = ids == tokenizer.eos_token_id
            length = torch.where(is_eos.any(1), is_eos.int().argmax(1) + 1, 7)  # 7: no EOS within 6 tokens
            counts += torch.bincount(length, minlength=8)[1:].float()
        return counts

    with torch.no_grad():
        ours = lengths(lambda: draw(model, batch["input_ids"], batch["attention_mask"], generation_config)[0])
        reference = lengths(lambda: model.generate(**batch, generation_config=generation_config).sequences[:, -6:])
    assert 0.05 < ours[:6].sum() / ours.sum() < 0.95, "the lengths must vary for the test to mean anything"
    statistic, degrees = two_sample_chi_square(ours, reference)
    assert statistic < chi_square_quantile(0.999, degrees), (ours, reference)


def two_sample_chi_square(a: torch.Tensor, b: torch.Tensor) -> tuple[float, int]:
    """Pearson's statistic for "a and b are counts drawn from one distribution", over the categories either saw."""
    seen = (a + b) > 0
    a, b = a[seen], b[seen]
    total = a + b
    expected_a, expected_b = total * a.sum() / total.sum(), total * b.sum() / total.sum()
    statistic = ((a - expected_a) ** 2 / expected_a + (b - expected_b) ** 2 / expected_b).sum().item()
    return statistic, int(seen.sum()) - 1


def chi_square_quantile(p: float, degrees: int) -> float:
    """Wilson and Hilferty's approximation of the chi-square quantile (good to a few percent for 3+ degrees)."""
    z = math.sqrt(2) * torch.erfinv(torch.tensor(2 * p - 1)).item()
    return degrees * (1 - 2 / (9 * degrees) + z * math.sqrt(2 / (9 * degrees))) ** 3


def test_the_lean_loop_declines_what_it_does_not_cover(model_and_prompts):
    model, tokenizer, _ = model_and_prompts
    assert why_not_lean(model, config(tokenizer, 4)) is None
    assert "stop_strings" in why_not_lean(model, config(tokenizer, 4, stop_strings=["="]))


def test_a_model_with_sliding_window_layers_falls_back_to_generate(tmp_path, caplog):
    from accelerate import Accelerator

    from grpo_kit.testing import build_tiny_model
    from grpo_kit_transformers.generation import TransformersGeneration, TransformersGenerationConfig

    directory = build_tiny_model(tmp_path, use_sliding_window=True, sliding_window=4, max_window_layers=1)
    model = AutoModelForCausalLM.from_pretrained(directory)
    generation = TransformersGeneration(TransformersGenerationConfig(max_completion_length=4))
    generation.start(model, AutoTokenizer.from_pretrained(directory), Accelerator(cpu=True))
    assert generation.loop == "generate"
    assert "model.generate samples instead, because the model is not a decoder with full attention" in caplog.text


def test_a_cache_for_generate_is_refused_with_the_lean_loop():
    from grpo_kit.contract.errors import ConfigError
    from grpo_kit_transformers.configs import TransformersGenerationConfig

    with pytest.raises(ConfigError, match="add generation.loop=generate"):
        TransformersGenerationConfig(loop="lean", cache_implementation="static")
    assert TransformersGenerationConfig(loop="generate", cache_implementation="static").loop == "generate"
    with pytest.raises(ConfigError, match="add generation.loop=generate"):
        TransformersGenerationConfig(loop="static", cache_implementation="static")
    with pytest.raises(ConfigError, match="must be auto, lean, static or generate"):
        TransformersGenerationConfig(loop="fast")


def test_auto_samples_with_the_lean_loop_on_a_cpu_unless_generate_s_cache_is_asked_for(tmp_path):
    from accelerate import Accelerator

    from grpo_kit.testing.models import build_tiny_model
    from grpo_kit_transformers.configs import TransformersGenerationConfig
    from grpo_kit_transformers.generation import TransformersGeneration

    directory = build_tiny_model(tmp_path)
    model, tokenizer = AutoModelForCausalLM.from_pretrained(directory), AutoTokenizer.from_pretrained(directory)
    for cache_implementation, lean in ((None, True), ("static", False)):
        config = TransformersGenerationConfig(max_completion_length=4, cache_implementation=cache_implementation)
        generation = TransformersGeneration(config)
        generation.start(model, tokenizer, Accelerator(cpu=True))
        assert config.loop == "auto" and (generation.loop == "lean") == lean


def test_it_calls_the_model_without_deprecated_arguments(model_and_prompts):
    """transformers 5 renamed `past_key_values` to `cache` and warns at every call that uses the old name."""
    model, tokenizer, prompts = model_and_prompts
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        sample(model, prompts.input_ids, prompts.attention_mask, config(tokenizer, 4), with_logprobs=True)
