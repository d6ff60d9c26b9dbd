"""Causal self-attention for the training passes on the CPU, in chunks of queries that read only the keys before them.

What it speeds up: the attention of a CPU model's forward and backward passes. torch's CPU flash-attention kernel
reads keys in blocks of 512, so over a sequence of up to 512 tokens its causal pass scores every query against
every key and masks the later ones away: causality saves it nothing. Cut into chunks of about 64 queries, each
reading the keys up to its own last query, the pass does little more than half that work. The values and gradients
are SDPA's up to float rounding.

When it applies: the passes of a CPU model that runs SDPA, without activation checkpointing (its backward pass
recomputes the forward with the model's own attention), over sequences of at least MIN_CHUNKS chunks, without a mask
(model.mask_free_passes), cache, dropout, soft-capping or autocast. GPUs keep SDPA, whose kernels skip the masked
blocks themselves.

Switch: model.cpu_chunked_attention=false keeps SDPA. Figures: benchmarks/README.md, "Chunked causal attention".
The attention is registered into transformers' registries when a model first runs it, not when this module is
imported.
"""

import contextlib
import functools

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

CHUNKED_CAUSAL = "grpo_kit_chunked_causal"  # the name `chunked_causal_attention` is registered under in transformers
QUERIES_PER_CHUNK = 64  # fewer chunks leave more masked scores; more spend more calls
MIN_CHUNKS = 3  # below 192 tokens, the calls cost what the chunks save
FLASH_READS_GROUPED_KEYS = tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 5)

_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


def chunked_causal_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """transformers' `sdpa` attention, computed chunk by chunk where it is a plain causal self-attention: no mask
    (the model's mask function found causality enough), no cache, no dropout, nothing added to the scores, no
    autocast."""
    length = query.shape[2]
    if (
        attention_mask is not None
        or key.shape[2] != length
        or length // QUERIES_PER_CHUNK < MIN_CHUNKS
        or not kwargs.get("is_causal", getattr(module, "is_causal", True))
        or dropout
        or not query.dtype == key.dtype == value.dtype
        or torch.is_autocast_enabled(query.device.type)  # SDPA casts its inputs to autocast's precision itself
        or any(kwargs.get(name) is not None for name in ("softcap", "position_bias"))
        or not (FLASH_READS_GROUPED_KEYS or key.shape[1] == query.shape[1])
    ):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    count = length // QUERIES_PER_CHUNK
    cuts = [length * index // count for index in range(count + 1)]
    return ChunkedCausalAttention.apply(query, key, value, scale, list(zip(cuts[:-1], cuts[1:]))), None


class ChunkedCausalAttention(torch.autograd.Function):
    """Queries (B, Hq, T, D) against keys and values (B, Hkv, T, D), one chunk of queries [start, end) at a time
    against keys [0, end). The output is written straight into the (B, T, Hq, D) layout the layer reads next, and
    is the only copy kept for the backward pass, as SDPA keeps one."""

    @staticmethod
    def forward(ctx, query, key, value, scale, chunks):  # -> (B, T, Hq, D)
        batch, heads, length, dim = query.shape
        out = query.new_empty(batch, length, heads, dim)
        logsumexps = []
        for start, end in chunks:
            chunk_out, logsumexp = _flash(
                query[:, :, start:end],
                key[:, :, :end],
                value[:, :, :end],
                0.0,
                start == 0,
                attn_mask=_later_keys_masked(start, end, query),
                scale=scale,
            )  # (B, Hq, end - start, D), (B, Hq, end - start)
            out[:, start:end] = chunk_out.transpose(1, 2)
            logsumexps.append(logsumexp)
        ctx.save_for_backward(query, key, value, out, *logsumexps)
        ctx.scale, ctx.chunks = scale, chunks
        return out

    @staticmethod
    def backward(ctx, grad_out):  # (B, T, Hq, D)
        query, key, value, out, *logsumexps = ctx.saved_tensors
        grad_query = torch.empty_like(query)
        grad_key, grad_value = torch.zeros_like(key), torch.zeros_like(value)
        for (start, end), logsumexp in zip(ctx.chunks, logsumexps):
            chunk_grads = _flash_backward(
                grad_out[:, start:end].transpose(1, 2),
                query[:, :, start:end],
                key[:, :, :end],
                value[:, :, :end],
                out[:, start:end].transpose(1, 2),
                logsumexp,
                0.0,
                start == 0,
                attn_mask=_later_keys_masked(start, end, query),
                scale=ctx.scale,
            )
            grad_query[:, :, start:end] = chunk_grads[0]
            grad_key[:, :, :end] += chunk_grads[1]
            grad_value[:, :, :end] += chunk_grads[2]
        return grad_query, grad_key, grad_value, None, None


def _later_keys_masked(start: int, end: int, query: torch.Tensor) -> torch.Tensor | None:  # (1, 1, end - start, end)
    """What the scores of queries [start, end) against keys [0, end) add: -inf past each query's own position. The
    first chunk needs none: its queries and keys start together, where the kernel's own causal flag is right."""
    if start == 0:
        return None
    keys = torch.arange(end, device=query.device)
    queries = torch.arange(start, end, device=query.device).unsqueeze(1)
    mask = torch.zeros(end - start, end, dtype=query.dtype, device=query.device)
    return mask.masked_fill_(keys > queries, float("-inf"))[None, None]


@functools.cache
def register() -> None:
    """Make CHUNKED_CAUSAL an attention transformers' models can run, with SDPA's mask function."""
    AttentionInterface.register(CHUNKED_CAUSAL, chunked_causal_attention)
    AttentionMaskInterface.register(CHUNKED_CAUSAL, sdpa_mask)


@contextlib.contextmanager
def chunked_causal_attention_on_cpu(model):
    """While in this context, a CPU model that runs SDPA runs `chunked_causal_attention` instead (the model's config
    says which attention its layers call). A model with activation checkpointing keeps SDPA: its backward pass
    recomputes the forward outside this context, and must find the tensors the first forward saved."""
    config = model.config.get_text_config(decoder=True)
    if (
        model.device.type != "cpu"
        or config._attn_implementation != "sdpa"
        or any(getattr(module, "gradient_checkpointing", False) for module in model.modules())
    ):
        yield
        return
    register()
    config._attn_implementation = CHUNKED_CAUSAL
    try:
        yield
    finally:
        config._attn_implementation = "sdpa"
