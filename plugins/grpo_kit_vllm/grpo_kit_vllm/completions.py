"""Between grpo_kit's prompts and completions and what vLLM takes and returns: token ids, sampling settings.

Prompts reach a backend repeated num_generations times, each group's members adjacent; vLLM samples `n`
completions of one prompt from a single prefill. So each run of identical prompts is sent once with `n` = its
length, and the completions come back in order.
"""

import contextlib
from dataclasses import dataclass, replace

import torch

from grpo_kit import Completions, GenerationConfig, is_truncated

GREEDY_TEMPERATURE = 1e-5  # vLLM samples greedily below it (sampling_params.py: _SAMPLING_EPS)


@dataclass(frozen=True)
class CompletionBatch:
    """One /v1/completions request: `n` completions of each of its runs of identical prompts."""

    runs: list[int]  # indices into the runs
    n: int


def prompt_runs(prompt_ids: list[list[int]]) -> list[tuple[list[int], int]]:
    """Each run of identical adjacent prompts as (prompt, how many times)."""
    runs: list[tuple[list[int], int]] = []
    for ids in prompt_ids:
        if runs and runs[-1][0] == ids:
            runs[-1] = (ids, runs[-1][1] + 1)
        else:
            runs.append((ids, 1))
    return runs


def plan_requests(
    prompt_ids: list[list[int]], temperature: float, max_prompts: int
) -> tuple[list[tuple[list[int], int]], list[CompletionBatch]]:
    """The runs of identical prompts, and the requests that complete them all, as vLLM takes them.

    One request per run length (usually a single one, n = num_generations), split so that no request carries more
    than `max_prompts` prompts (vLLM answers 400 above VLLM_MAX_COMPLETION_PROMPTS, 1024 by default). Greedy
    decoding refuses n > 1 (SamplingParams._verify_greedy_sampling), so there every copy is a prompt of its own.
    """
    runs = prompt_runs(prompt_ids)
    if temperature < GREEDY_TEMPERATURE:
        runs = [(ids, 1) for ids, count in runs for _ in range(count)]
    by_count: dict[int, list[int]] = {}
    for index, (_, count) in enumerate(runs):
        by_count.setdefault(count, []).append(index)
    batches = [
        CompletionBatch(indices[start : start + max_prompts], count)
        for count, indices in by_count.items()
        for start in range(0, len(indices), max_prompts)
    ]
    return runs, batches


def sampling_fields(config: GenerationConfig, eos_token_ids: list[int], with_logprobs: bool) -> dict:
    """GenerationConfig's settings as /v1/completions (and vllm.SamplingParams) name them.

    Every one is sent, the off values too: vLLM fills an unset field from the model's generation_config.json (a
    top_k of 20, say), which would sample from another distribution than the one the trainer scores. Every EOS id
    of the trainer's model goes as a stop token (kept in the completion, as vLLM keeps its EOS): vLLM adds those of
    the checkpoint's generation config itself, unless it was started with another one.
    """
    fields = {
        "max_tokens": config.max_completion_length,
        "temperature": config.temperature,
        "top_p": config.top_p,
        "top_k": config.top_k or 0,  # 0: off
        "min_p": config.min_p or 0.0,  # 0: off
        "repetition_penalty": config.repetition_penalty,
        "stop_token_ids": eos_token_ids,
    }
    if with_logprobs:
        fields["logprobs"] = 0  # the sampled token's log-prob only
    if config.structured_outputs_regex is not None:
        # vLLM 0.33's field, in /v1/completions, the tokens route's sampling_params and SamplingParams alike:
        # StructuredOutputsParams, of which `regex` is one kind of constraint.
        fields["structured_outputs"] = {"regex": config.structured_outputs_regex}
    return fields


@contextlib.contextmanager
def sampling(backend, temperature: float | None, top_p: float | None):
    """Generation's `sampling` for both vLLM backends (a method of each): evaluation's temperature and top-p (None:
    the run's) in the backend's config, whose fields every request reads; checked as the run's are."""
    run_config = backend.config
    changed = {name: value for name, value in (("temperature", temperature), ("top_p", top_p)) if value is not None}
    backend.config = replace(run_config, **changed)
    try:
        yield
    finally:
        backend.config = run_config


@dataclass
class Sample:
    """One completion as a server returns it."""

    token_ids: list[int]  # up to and including the EOS or stop token that ended it
    logprobs: list[float] | None  # the sampler's log-prob of each token (vLLM's processed_logprobs)

    @classmethod
    def from_choice(cls, choice: dict) -> "Sample":
        logprobs = choice.get("logprobs")
        return cls(
            token_ids=list(choice["token_ids"]),
            logprobs=None if logprobs is None else [float(value) for value in logprobs["token_logprobs"]],
        )


def to_completions(
    samples: list[Sample], eos_token_ids: list[int], pad_token_id: int, with_logprobs: bool, device
) -> Completions:
    """Right-padded tensors; a server stops at EOS and keeps it, so every returned token is active.

    Truncated is decided from the tokens, as for every backend (grpo_kit.is_truncated), not from vLLM's finish
    reason: a completion cut at max_tokens whose last token is the pad token counts as finished, and one ended by
    a stop string or a stop token other than EOS (in `generation_kwargs`) as cut off, as in TRL.
    """
    length = max([len(sample.token_ids) for sample in samples] + [1])
    ids = torch.full((len(samples), length), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(samples), length), dtype=torch.int)
    logps = torch.zeros((len(samples), length)) if with_logprobs else None
    for row, sample in enumerate(samples):
        size = len(sample.token_ids)
        ids[row, :size] = torch.tensor(sample.token_ids, dtype=torch.long)
        mask[row, :size] = 1
        if with_logprobs:
            if sample.logprobs is None or len(sample.logprobs) != size:
                raise ValueError(
                    "The server returned no log-prob for some sampled tokens; a rollout correction needs them."
                )
            logps[row, :size] = torch.tensor(sample.logprobs)
    truncated = is_truncated(ids, mask, eos_token_ids, pad_token_id)
    return Completions(
        ids.to(device), mask.to(device), truncated.to(device), None if logps is None else logps.to(device)
    )
