"""The static decode loop samples what `model.generate` samples, with the properties that make it fast on a GPU.

- With the same seed on a CPU, its tokens are `generate`'s, bit for bit, rows that end early included (it keeps
  them in place, as `generate` does), and its log-probs are those of `generate`'s scores, under every setting.
- The CPU's proxies for a GPU's costs (grpo_kit.testing.dispatch), over one generation batch: at most one host
  value read per CHECK_EVERY decode steps, at most two distinct input shapes of the model's forward (the prompts'
  pass, then every decode step alike), and under bf16 no weight cast at each decode step. The lean loop fails the
  first two, which shows they can fail.
- One KV cache capacity for the run, grown (and rounded up) only for a longer prompt.
"""

import copy
import logging

import pytest
import torch
from accelerate import Accelerator
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from grpo_kit.testing.dispatch import DispatchCounter, forward_input_shapes
from grpo_kit_transformers.cast_once import weights_cast_once
from grpo_kit_transformers.configs import TransformersGenerationConfig
from grpo_kit_transformers.generation import TransformersGeneration, chosen_loop
from grpo_kit_transformers.sampling import sample
from grpo_kit_transformers.static import CAPACITY_MULTIPLE, CHECK_EVERY, StaticDecoder, exponential_race

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
    return model, tokenizer, left_padded(tokenizer, ["1+2=", "34+5=", "7+77=", "9="] * 8)


def left_padded(tokenizer, texts):
    return tokenizer.pad(
        {"input_ids": [tokenizer(text).input_ids for text in texts]}, padding_side="left", return_tensors="pt"
    )


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
def test_with_the_same_seed_it_samples_generates_tokens_and_their_log_probs(model_and_prompts, settings):
    model, tokenizer, prompts = model_and_prompts
    generation_config = config(tokenizer, 16, **settings)
    torch.manual_seed(3)
    out = model.generate(**prompts, generation_config=generation_config, output_scores=True)
    torch.manual_seed(3)
    ids, logps = StaticDecoder().sample(model, prompts.input_ids, prompts.attention_mask, generation_config, True)
    expected_ids = out.sequences[:, prompts.input_ids.shape[1] :]
    ended_early = (expected_ids[:, :-1] == tokenizer.eos_token_id).any(1).sum()
    assert ended_early >= 4, "too few rows ended early for the test to mean anything"
    assert torch.equal(ids, expected_ids)  # the same width too: both stop where the last row ends
    expected = torch.stack(out.scores, dim=1).log_softmax(-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(logps, expected, atol=1e-5, rtol=0)  # -inf alike where a filter dropped the pad


@pytest.mark.parametrize("max_new_tokens", [1, 2, 3, 16])
def test_the_order_of_a_recorded_step_draws_the_same_tokens(model_and_prompts, max_new_tokens, monkeypatch):
    """On CUDA the first decode step runs on a side stream, the second is recorded (not run) and every later one
    replays it: the same steps in the same order, simulated here with the eager step in each role."""
    import grpo_kit_transformers.static as static

    model, tokenizer, prompts = model_and_prompts
    generation_config = config(tokenizer, max_new_tokens, temperature=1.5)
    torch.manual_seed(4)
    expected, _ = StaticDecoder().sample(model, prompts.input_ids, prompts.attention_mask, generation_config)
    recorded = []
    monkeypatch.setattr(static, "records_graphs", lambda device: True)
    monkeypatch.setattr(static.StaticBatch, "decode_step_on_side_stream", static.StaticBatch.decode_step)
    monkeypatch.setattr(static, "cuda_graph", lambda step: recorded.append(step) or step)  # recorded, not run
    torch.manual_seed(4)
    ids, _ = StaticDecoder().sample(model, prompts.input_ids, prompts.attention_mask, generation_config)
    assert torch.equal(ids, expected)
    assert len(recorded) == (1 if max_new_tokens > 2 else 0)


def test_the_exponential_race_is_multinomials_draw():
    probs = torch.randn(64, 500, generator=torch.Generator().manual_seed(0)).softmax(-1)
    probs[:, :100] = 0  # filtered tokens
    torch.manual_seed(7)
    expected = torch.multinomial(probs, 1).squeeze(1)
    torch.manual_seed(7)
    assert torch.equal(exponential_race(probs), expected)


def test_one_host_read_per_check_and_two_forward_shapes_per_generation_batch(model_and_prompts):
    model, tokenizer, prompts = model_and_prompts
    steps = 6 * CHECK_EVERY
    generation_config = config(tokenizer, steps, suppress_tokens=[tokenizer.eos_token_id])  # every step runs
    decoder = StaticDecoder()
    decoder.sample(model, prompts.input_ids, prompts.attention_mask, generation_config)  # a run's first batch
    with forward_input_shapes(model) as calls, DispatchCounter() as counter:
        ids, _ = decoder.sample(model, prompts.input_ids, prompts.attention_mask, generation_config)
    assert ids.shape[1] == steps and len(calls) == steps  # the prompts' pass and steps - 1 decode steps
    assert counter.host_reads <= steps // CHECK_EVERY, counter.host_reads
    assert len(set(calls)) <= 2, sorted(set(calls))
    assert counter.ops["aten.multinomial.default"] == 0


def test_the_lean_loop_fails_those_proxies(model_and_prompts):
    model, tokenizer, prompts = model_and_prompts
    steps = 6 * CHECK_EVERY
    generation_config = config(tokenizer, steps, suppress_tokens=[tokenizer.eos_token_id])
    with forward_input_shapes(model) as calls, DispatchCounter() as counter:
        sample(model, prompts.input_ids, prompts.attention_mask, generation_config)
    assert counter.host_reads > steps  # at least one per step
    assert len(set(calls)) > steps // 2  # the attention mask grows at every step


def test_the_kv_cache_is_sized_once_for_the_run_and_finished_rows_stay(model_and_prompts):
    model, tokenizer, prompts = model_and_prompts
    decoder = StaticDecoder()
    generation_config = config(tokenizer, 8, temperature=3.0)
    shapes = []
    for texts in (["1+2="] * 4, ["34+5=", "9="] * 2, ["12345678+1234567=", "1="] * 2):
        batch = left_padded(tokenizer, texts)
        with forward_input_shapes(model) as calls:
            decoder.sample(model, batch.input_ids, batch.attention_mask, generation_config)
        shapes.append((decoder.capacity, calls))
    short = -(-(len(tokenizer("34+5=").input_ids) + 8) // CAPACITY_MULTIPLE) * CAPACITY_MULTIPLE
    longest = len(tokenizer("12345678+1234567=").input_ids) + 8
    assert [capacity for capacity, _ in shapes] == [short, short, max(short, -(-longest // 64) * 64)]
    for capacity, calls in shapes:
        decode_masks = [dict(call)["attention_mask"] for call in calls[1:]]
        assert set(decode_masks) <= {(4, 1, 1, capacity)}  # every row, every key column, at every step


@pytest.mark.parametrize("loop", ["static", "lean", "generate"])
def test_under_bf16_the_weights_are_cast_once_per_generation_batch(tiny_model, loop, fresh_accelerate_state):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    model = accelerator.prepare(AutoModelForCausalLM.from_pretrained(tiny_model))
    generation = TransformersGeneration(
        TransformersGenerationConfig(
            loop=loop, max_completion_length=16, generation_kwargs={"suppress_tokens": [tokenizer.eos_token_id]}
        )
    )
    generation.start(model, tokenizer, accelerator)
    linear_weights = {
        parameter
        for module in model.modules()
        if isinstance(module, torch.nn.Linear)
        for parameter in module.parameters(recurse=False)
    }
    prompt_ids = [tokenizer("1+2=").input_ids, tokenizer("34+5=").input_ids] * 4

    torch.manual_seed(0)
    with DispatchCounter(watched=linear_weights) as once:
        out = generation.generate(prompt_ids, with_logprobs=True)
    assert once.watched_casts == len(linear_weights)  # each weight and bias once, the tied head's with the embedding's
    generation.cast_dtype = None  # accelerate's autocast alone: every forward casts every weight again
    torch.manual_seed(0)
    with DispatchCounter(watched=linear_weights) as each_step:
        reference = generation.generate(prompt_ids, with_logprobs=True)
    assert each_step.watched_casts >= 16 * len(linear_weights)
    # The same bf16 values as autocast's own casts: the same tokens and log-probs.
    assert torch.equal(out.completion_ids, reference.completion_ids)
    torch.testing.assert_close(out.sampling_per_token_logps, reference.sampling_per_token_logps, atol=0, rtol=0)


def test_casting_once_leaves_a_replaced_forward_and_the_embeddings_alone(tiny_model):
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    head = model.get_output_embeddings()
    own_forward = head.forward = lambda hidden: hidden  # as model.cast_lm_head_to_fp32 replaces it
    attention = model.model.layers[0].self_attn.q_proj
    with weights_cast_once(model, "cpu", torch.bfloat16):
        assert head.forward is own_forward
        assert attention.forward.keywords["weight"].dtype == torch.bfloat16
        assert model.model.embed_tokens.weight.dtype == torch.float32
    assert "forward" not in vars(attention) and attention.weight.dtype == torch.float32


def test_auto_samples_with_the_static_loop_on_a_cuda_gpu():
    assert chosen_loop(TransformersGenerationConfig(), "cuda") == "static"
    assert chosen_loop(TransformersGenerationConfig(), "cpu") == "lean"
    assert chosen_loop(TransformersGenerationConfig(cache_implementation="static"), "cuda") == "generate"
    assert chosen_loop(TransformersGenerationConfig(), "mps") == "generate"
    assert chosen_loop(TransformersGenerationConfig(loop="static"), "cpu") == "static"


@pytest.mark.parametrize(
    "kwargs, reason",
    [
        (dict(no_repeat_ngram_size=2), "NoRepeatNGramLogitsProcessor may read the input ids' length"),
        (dict(min_new_tokens=2), "MinNewTokensLengthLogitsProcessor may read the input ids' length"),
    ],
)
def test_a_processor_that_reads_the_length_falls_back_to_generate_with_one_warning(tiny_model, kwargs, reason, caplog):
    generation = TransformersGeneration(TransformersGenerationConfig(loop="static", generation_kwargs=kwargs))
    with caplog.at_level(logging.WARNING, logger="grpo_kit_transformers.generation"):
        generation.start(
            AutoModelForCausalLM.from_pretrained(tiny_model),
            AutoTokenizer.from_pretrained(tiny_model),
            Accelerator(cpu=True),
        )
    assert generation.loop == "generate"
    assert f"generation.loop=static: model.generate samples instead, because {reason}" in caplog.text


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("max_new_tokens", [1, 2, 3, 40])  # no decode step; the side stream's only; one replay; many
def test_on_cuda_the_replayed_graph_draws_generates_greedy_tokens(model_and_prompts, max_new_tokens):
    model, tokenizer, prompts = model_and_prompts
    model = copy.deepcopy(model).cuda()
    prompts = prompts.to("cuda")
    generation_config = config(tokenizer, max_new_tokens, top_k=1)  # the exponential race's argmax is the greedy one
    expected = model.generate(**prompts, generation_config=generation_config).sequences[:, prompts.input_ids.shape[1] :]
    decoder = StaticDecoder()
    for _ in range(2):  # the second call records its graph again, into the same capacity
        ids, logps = decoder.sample(model, prompts.input_ids, prompts.attention_mask, generation_config, True)
        assert torch.equal(ids, expected)
        assert (logps == 0).all()  # top-k 1: the drawn token holds all the probability


@pytest.mark.gpu
@needs_cuda
def test_a_bf16_policy_samples_with_the_recorded_static_loop(tiny_model, fresh_accelerate_state):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    accelerator = Accelerator(mixed_precision="bf16")
    model = accelerator.prepare(AutoModelForCausalLM.from_pretrained(tiny_model))
    generation = TransformersGeneration(TransformersGenerationConfig(max_completion_length=24, temperature=2.0))
    generation.start(model, tokenizer, accelerator)
    assert generation.loop == "static" and generation.cast_dtype == torch.bfloat16
    out = generation.generate([tokenizer("1+2=").input_ids, tokenizer("34+5=").input_ids] * 16, with_logprobs=True)
    lengths = out.completion_mask.sum(1)
    assert (out.completion_mask == (torch.arange(out.completion_mask.shape[1], device="cuda") < lengths[:, None])).all()
    assert torch.isfinite(out.sampling_per_token_logps).all() and (out.sampling_per_token_logps <= 0).all()
    assert 1 < lengths.float().mean() < 24, "hot sampling from a random model ends some completions, not all at once"


def test_the_runs_config_and_evaluations_are_completed_once_each(model_and_prompts, monkeypatch):
    import grpo_kit_transformers.static as static

    model, tokenizer, _ = model_and_prompts
    completions = []
    monkeypatch.setattr(static, "prepared", lambda *args: completions.append(args[1]) or args[1])
    decoder = StaticDecoder()
    run, evaluation, next_evaluation = (config(tokenizer, 4) for _ in range(3))
    for generation_config in (run, run, evaluation, run, run, next_evaluation, run, run):
        decoder.completed(model, generation_config, "cpu")
    assert [id(c) for c in completions] == [id(run), id(evaluation), id(next_evaluation)]
