"""The chunked causal attention of the CPU training passes: SDPA's values and gradients, and where SDPA stays."""

import contextlib
import subprocess
import sys
import textwrap

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from grpo_kit.model.fast import causal_attention
from grpo_kit.model.fast.causal_attention import (
    CHUNKED_CAUSAL,
    chunked_causal_attention,
    chunked_causal_attention_on_cpu,
)
from grpo_kit.model.loading import enable_checkpointing


class Layer(torch.nn.Module):
    """What transformers' `sdpa` attention reads of the layer that calls it."""

    is_causal = True

    def __init__(self, query, key):
        super().__init__()
        self.num_key_value_groups = query.shape[1] // key.shape[1]


def qkv(length: int, heads: int = 4, kv_heads: int = 2, batch: int = 3, dtype=torch.float32):
    """Queries, keys and values in the layout a transformers layer hands them over: (B, H, T, D) views of
    (B, T, H, D) tensors, as the projections and RoPE leave them."""
    generator = torch.Generator().manual_seed(length + heads + kv_heads)

    def tensor(h):
        return torch.randn(batch, length, h, 16, generator=generator, dtype=dtype).transpose(1, 2).requires_grad_()

    return tensor(heads), tensor(kv_heads), tensor(kv_heads)


def output_and_grads(attention, query, key, value, **kwargs):
    for tensor in (query, key, value):
        tensor.grad = None
    out, _ = attention(Layer(query, key), query, key, value, None, scaling=0.3, **kwargs)  # (B, T, Hq, D)
    out.backward(torch.linspace(-1, 1, out.numel()).reshape(out.shape).to(out.dtype))
    return out.detach().clone(), [tensor.grad.clone() for tensor in (query, key, value)]


@pytest.mark.parametrize("length", [192, 200, 517])
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_values_and_gradients_are_sdpa_s(length, kv_heads):
    query, key, value = qkv(length, kv_heads=kv_heads)
    expected, expected_grads = output_and_grads(sdpa_attention_forward, query, key, value)
    out, grads = output_and_grads(chunked_causal_attention, query, key, value)
    assert out.shape == expected.shape and out.is_contiguous()
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-5)
    for grad, expected_grad in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected_grad, rtol=0, atol=1e-5)


def test_bfloat16_values_are_sdpa_s_to_its_precision():
    query, key, value = qkv(256, dtype=torch.bfloat16)
    expected, expected_grads = output_and_grads(sdpa_attention_forward, query, key, value)
    out, grads = output_and_grads(chunked_causal_attention, query, key, value)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, expected, rtol=2e-2, atol=2e-2)
    for grad, expected_grad in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected_grad, rtol=2e-2, atol=2e-2)


def test_it_runs_chunks_of_64_queries(monkeypatch):
    calls = []
    real = causal_attention._flash
    monkeypatch.setattr(
        causal_attention, "_flash", lambda *args, **kwargs: calls.append(args[0].shape[2]) or real(*args, **kwargs)
    )
    query, key, value = qkv(517)
    output_and_grads(chunked_causal_attention, query, key, value)
    assert len(calls) == 517 // 64 and sum(calls) == 517 and max(calls) - min(calls) <= 1


@pytest.mark.parametrize("case", ["short", "mask", "cache", "dropout", "not causal"])
def test_sdpa_itself_where_the_attention_is_not_plain_causal(case, monkeypatch):
    monkeypatch.setattr(causal_attention, "ChunkedCausalAttention", None)  # any use of it fails
    query, key, value = qkv(128 if case == "short" else 256)
    mask, kwargs = None, {}
    if case == "mask":
        mask = torch.ones(256, 256, dtype=torch.bool).tril()[None, None]
    elif case == "cache":
        query = query[:, :, -192:]
    elif case == "dropout":
        kwargs["dropout"] = 0.1
    else:
        kwargs["is_causal"] = False
    torch.manual_seed(0)
    out, _ = chunked_causal_attention(Layer(query, key), query, key, value, mask, scaling=0.3, **kwargs)
    torch.manual_seed(0)
    expected, _ = sdpa_attention_forward(Layer(query, key), query, key, value, mask, scaling=0.3, **kwargs)
    assert torch.equal(out, expected)


def tiny_model(attention: str = "sdpa") -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    layers = dict(num_hidden_layers=2, hidden_size=32, intermediate_size=64, max_position_embeddings=512)
    heads = dict(num_attention_heads=4, num_key_value_heads=2)
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=17, attn_implementation=attention, **layers, **heads))


def logits_and_grads(model, ids, context):
    model.zero_grad()
    with context:
        logits = model(input_ids=ids).logits
    logits.float().logsumexp(-1).mean().backward()
    return logits.detach(), [parameter.grad.clone() for parameter in model.parameters()]


def test_a_model_in_the_context_runs_it_and_gets_sdpa_back(monkeypatch):
    model = tiny_model()
    ids = torch.randint(0, 17, (2, 300), generator=torch.Generator().manual_seed(1))
    calls = []
    real = causal_attention.ChunkedCausalAttention.apply
    monkeypatch.setattr(causal_attention.ChunkedCausalAttention, "apply", lambda *args: calls.append(1) or real(*args))
    expected, expected_grads = logits_and_grads(model, ids, contextlib.nullcontext())
    assert not calls
    logits, grads = logits_and_grads(model, ids, chunked_causal_attention_on_cpu(model))
    assert len(calls) == 2  # one per layer
    assert model.config._attn_implementation == "sdpa"
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-5)
    for grad, expected_grad in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected_grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("setting", ["eager", "checkpointing"])
def test_models_it_leaves_alone(setting):
    model = tiny_model("eager" if setting == "eager" else "sdpa")
    if setting == "checkpointing":
        model.train()
        enable_checkpointing(model, {"use_reentrant": False})
    ids = torch.randint(0, 17, (2, 300), generator=torch.Generator().manual_seed(1))
    with chunked_causal_attention_on_cpu(model):
        seen = model.config._attn_implementation
        logits = model(input_ids=ids).logits
    logits.float().logsumexp(-1).mean().backward()  # checkpointing recomputes the forward here, with the same attention
    assert seen == setting.replace("checkpointing", "sdpa") != CHUNKED_CAUSAL


def test_under_autocast_the_model_keeps_sdpa(monkeypatch):
    monkeypatch.setattr(causal_attention, "ChunkedCausalAttention", None)  # any use of it fails
    model = tiny_model()
    ids = torch.randint(0, 17, (2, 300), generator=torch.Generator().manual_seed(1))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = model(input_ids=ids).logits
        with chunked_causal_attention_on_cpu(model):
            logits = model(input_ids=ids).logits
    assert torch.equal(logits, expected)


def test_importing_grpo_kit_registers_nothing_in_transformers_until_a_model_runs_it():
    code = textwrap.dedent(f"""
        import importlib, pkgutil
        import grpo_kit
        for module in pkgutil.walk_packages(grpo_kit.__path__, "grpo_kit."):
            if not module.name.endswith("__main__"):  # it runs the CLI
                importlib.import_module(module.name)
        import torch
        from transformers import AttentionInterface, Qwen2Config, Qwen2ForCausalLM
        from transformers.masking_utils import AttentionMaskInterface
        from grpo_kit.model.fast.causal_attention import chunked_causal_attention_on_cpu

        def registered():
            return [{CHUNKED_CAUSAL!r} in interface() for interface in (AttentionInterface, AttentionMaskInterface)]

        print("after import", registered())
        config = Qwen2Config(vocab_size=17, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                             num_attention_heads=4, num_key_value_heads=2, attn_implementation="sdpa")
        model = Qwen2ForCausalLM(config)
        with chunked_causal_attention_on_cpu(model):
            model(input_ids=torch.zeros(1, 200, dtype=torch.long))
        print("after a pass", registered())
    """)
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert child.returncode == 0, child.stderr
    printed = [line for line in child.stdout.splitlines() if line.startswith("after ")]  # a library may print too
    assert printed == ["after import [False, False]", "after a pass [True, True]"]
