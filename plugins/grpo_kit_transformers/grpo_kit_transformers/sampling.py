"""A lean sampling loop: what `model.generate` samples, for less.

It draws each token exactly as `generate` does: the same logits processors, built by transformers from the same
GenerationConfig and applied in the same order, then `torch.multinomial` on their softmax. It saves two costs that
dominate `generate` for the small models and short completions of RL runs:
- the KV cache is allocated once for the whole completion, where `generate`'s grows by concatenation, which copies
  the whole cache at every token (28% of a 32-token generation of a 0.6M-parameter model);
- a sequence that has ended leaves the batch (at most a few copies of the cache per generation), where `generate`
  computes every row until the last one ends: with completions of 50 tokens on average under a 128 cap, most of
  its work is on finished rows.
On the CPU, where a model runs torch's SDPA, it also computes the attention of each new token with two matrix
products over keys kept transposed (`decode_attention`), faster than SDPA's kernel for one query token (64
completions of 512 tokens from the 0.6M-parameter Qwen2 of benchmarks/race.py: 2.7-2.8 s instead of 3.1-3.3 s).
Each row's tokens follow the same distribution as with `generate`, up to the float rounding of that attention. The
random draws themselves differ once a row has left the batch (`multinomial` then draws for fewer rows); while none
has, with the same seed, the tokens are those of `generate` (tests/test_sampling.py checks both).
"""

import contextlib
import inspect

import torch
from transformers import AttentionInterface, GenerationConfig, LogitsProcessorList
from transformers.cache_utils import Cache, DynamicLayer
from transformers.generation import GenerationMode, logits_process
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

# Processors that read nothing but their own row, so that rows may leave the batch between tokens.
ROW_WISE = tuple(
    getattr(logits_process, name)
    for name in (
        "TemperatureLogitsWarper",
        "TopKLogitsWarper",
        "TopPLogitsWarper",
        "MinPLogitsWarper",
        "TopHLogitsWarper",
        "TypicalLogitsWarper",
        "EpsilonLogitsWarper",
        "EtaLogitsWarper",
        "RepetitionPenaltyLogitsProcessor",
        "NoRepeatNGramLogitsProcessor",
        "SuppressTokensLogitsProcessor",
        "SuppressTokensAtBeginLogitsProcessor",
        "MinLengthLogitsProcessor",
        "MinNewTokensLengthLogitsProcessor",
        "NoBadWordsLogitsProcessor",
        "SequenceBiasLogitsProcessor",
        "InfNanRemoveLogitsProcessor",
        "LogitNormalization",
        "ExponentialDecayLengthPenalty",
        "ForcedEOSTokenLogitsProcessor",
    )
    if hasattr(logits_process, name)
)
# Settings of a GenerationConfig that stop or steer generation otherwise than through row-wise logits processors.
NOT_ROW_WISE = ("stop_strings", "max_time", "guidance_scale", "watermarking_config", "forced_bos_token_id")
COMPACT_BELOW = 0.75  # leave the finished rows once the active ones fall below this share of the batch


DECODE_ATTENTION = "grpo_kit_decode"  # the name `decode_attention` is registered under in transformers


class PreallocatedLayer(DynamicLayer):
    """A layer of KV cache whose keys and values are views of buffers sized for the whole completion.

    With `transposed_keys`, the keys' buffer is laid out (B, H, D, capacity) and handed out as a transposed view
    (B, H, end, D): `decode_attention` then reads each head's keys along their contiguous dimension. Only that
    attention should see them: torch's SDPA kernel reads such keys many times slower than contiguous ones.
    """

    def __init__(self, capacity: int, transposed_keys: bool = False):
        super().__init__()
        self.capacity, self.transposed_keys = capacity, transposed_keys

    def update(self, key_states, value_states, *args, **kwargs):  # (B, H, n, D) each
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            batch, heads, _, dim = key_states.shape
            key_shape = (
                (batch, heads, dim, self.capacity) if self.transposed_keys else (batch, heads, self.capacity, dim)
            )
            self.key_buffer = key_states.new_empty(key_shape)
            self.value_buffer = value_states.new_empty(batch, heads, self.capacity, dim)
            self.length = 0
        end = self.length + key_states.shape[-2]
        self.stored_keys()[:, :, self.length : end] = key_states
        self.value_buffer[:, :, self.length : end] = value_states
        self.length = end
        self.keys, self.values = self.stored_keys()[:, :, :end], self.value_buffer[:, :, :end]  # (B, H, end, D)
        return self.keys, self.values

    def stored_keys(self):  # (B, H, capacity, D), a view of the buffer
        return self.key_buffer.transpose(-1, -2) if self.transposed_keys else self.key_buffer

    def batch_select_indices(self, indices):
        self.key_buffer, self.value_buffer = self.key_buffer[indices], self.value_buffer[indices]
        self.keys, self.values = self.stored_keys()[:, :, : self.length], self.value_buffer[:, :, : self.length]


def decode_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """SDPA's attention (transformers' `sdpa` implementation), with two matrix products for a single query token.

    A new token's query (B, Hq, 1, D) meets keys and values (B, Hkv, T, D) that it reads once. For 64 rows of up
    to 516 tokens on one CPU thread, torch's SDPA kernel takes 0.90 ms per call on average, the products below
    0.65 ms (with the keys transposed in the cache), for the same values up to float rounding. The prompt's pass,
    dropout and what SDPA adds to the scores (a position bias, a soft cap) go to SDPA itself.
    """
    if query.shape[2] != 1 or dropout or kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None:
        return sdpa_attention_forward(
            module, query, key.contiguous(), value, attention_mask, dropout, scaling, **kwargs
        )
    batch, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    scale = dim**-0.5 if scaling is None else scaling
    query = query.reshape(batch, kv_heads, heads // kv_heads, dim) * scale  # (B, Hkv, R, D): R heads share keys
    scores = query @ key.transpose(-1, -2)  # (B, Hkv, R, T)
    if attention_mask is not None:  # (B, 1, 1, T), from `sdpa_mask`
        if attention_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attention_mask, float("-inf"))
        else:
            scores = scores + attention_mask
    out = scores.softmax(dim=-1) @ value  # (B, Hkv, R, D)
    return out.reshape(batch, heads, 1, dim).transpose(1, 2), None  # (B, 1, Hq, D), as SDPA's forward returns it


AttentionInterface.register(DECODE_ATTENTION, decode_attention)
AttentionMaskInterface.register(DECODE_ATTENTION, sdpa_mask)


@contextlib.contextmanager
def attention_for_sampling(model):
    """Whether the cache should hold transposed keys: while in this context, a CPU model that runs SDPA runs
    `decode_attention` instead, which reads them (the model's config says which attention its layers call)."""
    config = model.config.get_text_config(decoder=True)
    if model.device.type != "cpu" or config._attn_implementation != "sdpa":
        yield False
        return
    config._attn_implementation = DECODE_ATTENTION
    try:
        yield True
    finally:
        config._attn_implementation = "sdpa"


def why_not_lean(model, generation_config: GenerationConfig) -> str | None:
    """Why the lean loop cannot stand in for `generate` with this model and config; None when it can."""
    text_config = model.config.get_text_config(decoder=True)
    layer_types = getattr(text_config, "layer_types", None) or ["full_attention"]
    if model.config.is_encoder_decoder or set(layer_types) != {"full_attention"}:
        return "the model is not a decoder with full attention in every layer"
    generation_config = prepared(model, generation_config, model.device)
    mode = generation_config.get_generation_mode()
    if mode != GenerationMode.SAMPLE:  # the loop draws one token per row at a time: plain multinomial sampling
        return f"the generation config asks for {mode.value.replace('_', ' ')}, and this loop only samples"
    used = [name for name in NOT_ROW_WISE if getattr(generation_config, name, None) is not None]
    if used:
        return f"the generation config sets {', '.join(used)}"
    for processor in logits_processors(model, generation_config, prompt_length=1):
        if not isinstance(processor, ROW_WISE):
            return f"{type(processor).__name__} may read other rows than its own"
    return None


# `prepared` and `logits_processors` call the private methods with which `generate` completes its config and builds
# its processors: calling them, rather than rewriting them, is what keeps the two loops drawing the same tokens.
def prepared(model, generation_config: GenerationConfig, device) -> GenerationConfig:
    """The config `generate` would sample with: `generation_config` completed from the model's own defaults."""
    generation_config, _ = model._prepare_generation_config(generation_config)
    model._prepare_special_tokens(generation_config, kwargs_has_attention_mask=True, device=device)
    return generation_config


def logits_processors(model, generation_config: GenerationConfig, prompt_length: int) -> LogitsProcessorList:
    """The processors `generate` would apply, in its order, built by transformers itself."""
    return model._get_logits_processor(
        generation_config=generation_config, input_ids_seq_length=prompt_length, device=model.device, model_kwargs={}
    )


def cache_argument(model) -> str:
    """The forward pass's name for the KV cache: `cache` since transformers 5.x, which warns at every call that
    still says `past_key_values`, the name of transformers 4 and of models written for it."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


@torch.no_grad()
def sample(model, prompt_ids, attention_mask, generation_config: GenerationConfig, with_logprobs: bool = False):
    """Completions of left-padded prompts (B, P): ids (B, T), and when asked, each sampled token's log-prob under
    the distribution it was drawn from (B, T). What follows a row's first EOS is undefined, for the caller to mask."""
    with attention_for_sampling(model) as transposed_keys:
        return _sample(model, prompt_ids, attention_mask, generation_config, with_logprobs, transposed_keys)


def _sample(model, prompt_ids, attention_mask, generation_config, with_logprobs: bool, transposed_keys: bool):
    batch, prompt_length = prompt_ids.shape
    generation_config = prepared(model, generation_config, prompt_ids.device)
    max_new_tokens = generation_config.max_new_tokens
    eos = generation_config._eos_token_tensor.reshape(-1)  # (E,)
    processors = logits_processors(model, generation_config, prompt_length)
    num_layers = model.config.get_text_config(decoder=True).num_hidden_layers
    cache = Cache(
        layers=[PreallocatedLayer(prompt_length + max_new_tokens, transposed_keys) for _ in range(num_layers)]
    )
    with_cache = {cache_argument(model): cache}
    # As `generate` numbers positions: from the first real token of each left-padded prompt.
    last_logits_only = {"logits_to_keep": 1} if model._supports_logits_to_keep() else {}  # as `generate` asks
    position_ids = (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 1)  # (B, P)

    completion_ids = torch.full((batch, max_new_tokens), generation_config.pad_token_id, device=prompt_ids.device)
    logps = torch.zeros(batch, max_new_tokens, device=prompt_ids.device) if with_logprobs else None
    rows = torch.arange(batch, device=prompt_ids.device)  # (A,) the batch rows still in the loop
    unfinished = torch.ones(batch, dtype=torch.bool, device=prompt_ids.device)  # (A,) no EOS yet
    input_ids, inputs = prompt_ids, prompt_ids  # input_ids (A, P + t): what the processors read
    last_position = position_ids[:, -1:]  # (A, 1)
    for t in range(max_new_tokens):
        logits = (
            model(
                input_ids=inputs,
                attention_mask=attention_mask,
                position_ids=position_ids,
                use_cache=True,
                **with_cache,
                **last_logits_only,
            )
            .logits[:, -1]
            .to(copy=True, dtype=torch.float32)
        )  # (A, V)
        next_scores = processors(input_ids, logits)  # (A, V)
        next_tokens = torch.multinomial(next_scores.softmax(dim=-1), num_samples=1)  # (A, 1)
        completion_ids[rows, t] = next_tokens.squeeze(1)
        if logps is not None:
            logps[rows, t] = next_scores.log_softmax(dim=-1).gather(-1, next_tokens).squeeze(1)
        unfinished &= ~torch.isin(next_tokens.squeeze(1), eos)
        if not unfinished.any():
            break
        input_ids = torch.cat([input_ids, next_tokens], dim=1)
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones(len(rows), 1)], dim=1)
        if unfinished.float().mean() < COMPACT_BELOW:
            keep = unfinished.nonzero().squeeze(1)
            rows, unfinished, input_ids, attention_mask = (
                rows[keep],
                unfinished[keep],
                input_ids[keep],
                attention_mask[keep],
            )
            last_position, next_tokens = last_position[keep], next_tokens[keep]
            cache.batch_select_indices(keep)
        last_position = last_position + 1
        inputs, position_ids = next_tokens, last_position
    return completion_ids[:, : t + 1], None if logps is None else logps[:, : t + 1]
