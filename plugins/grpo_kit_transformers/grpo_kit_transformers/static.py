"""A decode loop of fixed shapes and no host sync inside a step: what `model.generate` samples, ready for a CUDA graph.

On a GPU a decode step of a small model is mostly launch overhead, and `generate` (like the lean loop) pays more:
its key length grows by one token per step, so attention kernels see a new shape at every step (cuDNN plans one per
shape), and it reads a value on the host at every step (multinomial's checks, the finished-row tests), so the GPU
never runs ahead. This loop instead:
- sizes one KV cache for the whole run: its capacity is the longest prompt seen so far plus the completion cap,
  rounded up to CAPACITY_MULTIPLE, so it changes only when a longer prompt comes; every decode step attends over
  the whole capacity, the columns not written yet masked out;
- keeps finished rows in place (fed the pad token, as `generate` feeds them), so the batch never shrinks;
- draws each token by the exponential race, argmax(probs / Exp(1)): `torch.multinomial`'s own draw of one sample,
  token for token on a CPU from the same generator, without multinomial's checks on the host;
- reads one value on the host every CHECK_EVERY steps (have all rows ended, and where), and once at the end;
- on CUDA, records the decode step once per call as a CUDA graph and replays it; on a CPU it runs the same step
  eagerly, so that the tests here run the code a GPU runs.

Every row's tokens are `generate`'s, drawn from the same distribution by the same processors in the same order:
on a CPU with the same seed, they are the same tokens (tests/test_static.py), as long as `generate` runs; on CUDA,
where multinomial has a kernel of its own, the same distribution.
"""

import torch
from transformers import GenerationConfig
from transformers.cache_utils import Cache, StaticLayer
from transformers.generation import logits_process

from grpo_kit_transformers.sampling import cache_argument, logits_processors, prepared, why_not_lean

CAPACITY_MULTIPLE = 64  # the KV cache's capacity is rounded up to this many tokens
CHECK_EVERY = 8  # decode steps between two reads of "have all rows ended?"
# Processors that read nothing of the input ids but the set of tokens each row holds, so that they may read a buffer of
# fixed width whose columns not written yet repeat a token the row already holds.
FIXED_WIDTH = tuple(
    getattr(logits_process, name)
    for name in (
        "TemperatureLogitsWarper",
        "TopKLogitsWarper",
        "TopPLogitsWarper",
        "MinPLogitsWarper",
        "RepetitionPenaltyLogitsProcessor",
        "SuppressTokensLogitsProcessor",
    )
)


def why_not_static(model, generation_config: GenerationConfig) -> str | None:
    """Why the static loop cannot stand in for `generate` with this model and config; None when it can."""
    reason = why_not_lean(model, generation_config)
    if reason is not None:
        return reason
    for processor in logits_processors(model, prepared(model, generation_config, model.device), prompt_length=1):
        if not isinstance(processor, FIXED_WIDTH):
            return (
                f"{type(processor).__name__} may read the input ids' length, which the static loop keeps fixed (it "
                "runs temperature, top-k, top-p, min-p, repetition penalty and suppressed tokens)"
            )
    return None


def exponential_race(probs: torch.Tensor) -> torch.Tensor:  # (B, V) -> (B,)
    """One token per row drawn from `probs`: argmax(probs / Exp(1)) is a draw from probs (the race of exponential
    clocks), and on a CPU exactly the draw `torch.multinomial(probs, 1)` makes from the same generator, which
    computes it this way after checks that read values on the host."""
    return probs.div(torch.empty_like(probs).exponential_(1)).argmax(dim=-1)


class StaticDecoder:
    """The static loop of one run: it keeps the KV cache's capacity from call to call, growing only for a longer
    prompt, so that every call's decode step has the same shapes."""

    def __init__(self):
        self.capacity = 0
        # Completing a config reads values on the host (its special tokens' checks): done once per config.
        self.prepared: list[tuple[GenerationConfig, GenerationConfig]] = []

    def capacity_for(self, prompt_length: int, max_new_tokens: int) -> int:
        needed = prompt_length + max_new_tokens
        if needed > self.capacity:
            self.capacity = -(-needed // CAPACITY_MULTIPLE) * CAPACITY_MULTIPLE
        return self.capacity

    def completed(self, model, generation_config: GenerationConfig, device) -> GenerationConfig:
        """`generation_config` as `generate` completes it, kept for the two configs used last (the run's, and
        evaluation's, which is made afresh at each evaluation)."""
        kept = [pair for pair in self.prepared if pair[0] is generation_config]
        pair = kept[0] if kept else (generation_config, prepared(model, generation_config, device))
        self.prepared = [other for other in self.prepared if other is not pair][-1:] + [pair]
        return pair[1]

    @torch.no_grad()
    def sample(self, model, prompt_ids, attention_mask, generation_config: GenerationConfig, with_logprobs=False):
        """Completions of left-padded prompts (B, P): ids (B, T), and when asked, each sampled token's log-prob under
        the distribution it was drawn from (B, T). After a row's first EOS come pad tokens, as from `generate`."""
        generation_config = self.completed(model, generation_config, prompt_ids.device)
        max_new_tokens = generation_config.max_new_tokens
        capacity = self.capacity_for(prompt_ids.shape[1], max_new_tokens)
        batch = StaticBatch(model, prompt_ids, attention_mask, generation_config, capacity, with_logprobs)
        batch.prefill()
        step = None if records_graphs(prompt_ids.device) else batch.decode_step
        steps = 1
        while steps < max_new_tokens:
            if step is None:  # the first decode step warms up on a side stream, the second is recorded
                batch.decode_step_on_side_stream()
                steps += 1
                step = cuda_graph(batch.decode_step) if steps < max_new_tokens else None
                continue
            step()
            steps += 1
            if steps % CHECK_EVERY == 0 and steps < max_new_tokens and batch.all_ended_at() is not None:
                break
        width = batch.all_ended_at()
        width = steps if width is None else width + 1
        ids = batch.completion_ids[:, :width]
        return ids, None if batch.logps is None else batch.logps[:, :width]


def records_graphs(device: torch.device) -> bool:
    """Whether the decode step is recorded as a CUDA graph on `device` (else it runs eagerly)."""
    return device.type == "cuda"


def cuda_graph(step):
    """`step` recorded as a CUDA graph (run once on a side stream first): a function that replays it."""
    graph = torch.cuda.CUDAGraph()
    # thread_local: what other threads (reward workers, data loading) ask of CUDA meanwhile is not the capture's
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        step()
    return graph.replay


class StaticBatch:
    """One call's buffers, whose shapes and addresses stay fixed from the first decode step to the last."""

    def __init__(self, model, prompt_ids, attention_mask, generation_config, capacity: int, with_logprobs: bool):
        self.model, self.config = model, generation_config
        device = prompt_ids.device
        batch, self.prompt_length = prompt_ids.shape
        max_new_tokens = generation_config.max_new_tokens
        self.processors = logits_processors(model, generation_config, self.prompt_length)
        self.eos = generation_config._eos_token_tensor.reshape(-1)  # (E,)
        self.pad = generation_config.pad_token_id
        num_layers = model.config.get_text_config(decoder=True).num_hidden_layers
        self.cache = Cache(layers=[StaticLayer(max_cache_len=capacity) for _ in range(num_layers)])
        self.cache_argument = cache_argument(model)
        self.prompt_ids = prompt_ids
        self.prompt_positions = (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 1)  # (B, P)
        self.attended = torch.zeros(batch, capacity, dtype=torch.bool, device=device)  # (B, C) keys each row sees
        self.attended[:, : self.prompt_length] = attention_mask.bool()
        # What the processors read as the input ids: the prompt, then the tokens drawn so far; the columns not
        # written yet repeat the row's first column, a token the row holds, which counts as once for them.
        self.history = prompt_ids[:, :1].repeat(1, self.prompt_length + max_new_tokens)  # (B, P + T)
        self.history[:, : self.prompt_length] = prompt_ids
        self.completion_ids = torch.full((batch, max_new_tokens), self.pad, device=device)  # (B, T)
        self.logps = torch.zeros(batch, max_new_tokens, device=device) if with_logprobs else None  # (B, T)
        self.unfinished = torch.ones(batch, dtype=torch.bool, device=device)  # (B,)
        self.ended = torch.full((batch,), max_new_tokens, device=device)  # (B,) the step of each row's EOS
        self.step = torch.zeros(1, dtype=torch.long, device=device)  # the token being drawn
        self.column = torch.full((1,), self.prompt_length, device=device)  # the cache column of the next input
        self.token = torch.zeros(batch, 1, dtype=torch.long, device=device)  # (B, 1) the next input
        self.position = self.prompt_positions[:, -1:] + 1  # (B, 1) its position
        self.last_logits_only = {"logits_to_keep": 1} if model._supports_logits_to_keep() else {}

    def prefill(self) -> None:
        """The prompts' pass, and the first token drawn from it."""
        columns = torch.arange(self.attended.shape[1], device=self.attended.device)
        rows = torch.arange(self.prompt_length, device=self.attended.device).unsqueeze(1)
        causal = columns <= rows  # (P, C)
        # A padding position attends to itself alone: a query that sees no key would give NaN keys to later layers.
        mask = (causal & self.attended[:, None, :]) | (columns == rows)  # (B, P, C)
        logits = self.forward(self.prompt_ids, mask[:, None], self.prompt_positions)
        self.choose(logits)

    def decode_step(self) -> None:
        """Feed the last token drawn, draw the next: in place, on buffers of fixed address, with no value read."""
        self.attended.index_fill_(1, self.column, True)
        logits = self.forward(self.token, self.attended[:, None, None, :], self.position)
        self.choose(logits)
        self.column.add_(1)
        self.position.add_(1)

    def decode_step_on_side_stream(self) -> None:
        """A decode step on a stream of its own, as CUDA graphs want before recording (their memory settles)."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self.decode_step()
        torch.cuda.current_stream().wait_stream(stream)

    def forward(self, input_ids, mask, position_ids) -> torch.Tensor:  # (B, V)
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,  # 4D: the model takes it as it is
            position_ids=position_ids,
            use_cache=True,
            **{self.cache_argument: self.cache},
            **self.last_logits_only,
        )
        return out.logits[:, -1].to(copy=True, dtype=torch.float32)

    def choose(self, logits: torch.Tensor) -> None:  # (B, V)
        scores = self.processors(self.history, logits)  # (B, V)
        tokens = exponential_race(scores.softmax(dim=-1))  # (B,)
        tokens = torch.where(self.unfinished, tokens, self.pad)  # as `generate`: ended rows draw, then get the pad
        if self.logps is not None:
            logps = scores.log_softmax(dim=-1).gather(-1, tokens.unsqueeze(-1))  # (B, 1)
            self.logps.index_copy_(1, self.step, logps)
        self.completion_ids.index_copy_(1, self.step, tokens.unsqueeze(-1))
        self.history.index_copy_(1, self.step + self.prompt_length, tokens.unsqueeze(-1))
        is_eos = (tokens.unsqueeze(-1) == self.eos).any(dim=-1)  # (B,)
        self.ended.copy_(torch.where(self.unfinished & is_eos, self.step, self.ended))
        self.unfinished.logical_and_(~is_eos)
        self.token.copy_(tokens.unsqueeze(-1))
        self.step.add_(1)

    def all_ended_at(self) -> int | None:
        """The step of the last row's EOS once every row has ended, else None: the one value read on the host."""
        value = torch.where(self.unfinished.any(), -1, self.ended.max()).item()
        return None if value < 0 else value
