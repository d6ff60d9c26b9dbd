"""vLLM 0.33's answers, written from what the CPU test server's engine sampled: a completion, a chat completion and
the tokens route's answer, in vLLM's shapes.

The engine hands over plain `Sample`s (lists, no tensors) and a tokenizer to write tokens as text, so this module, as
the request rules in protocol.py, imports no torch.
"""

import itertools
import time
import uuid
from dataclasses import dataclass

from grpo_kit_vllm.testing.protocol import CompletionRequest

LOGPROB_FLOOR = -9999.0  # vLLM's stand-in for -inf, which JSON cannot carry


@dataclass(frozen=True)
class Sample:
    """One completion as sampled, before it is written out as a choice."""

    token_ids: list[int]
    finish_reason: str  # "stop": it sampled a stop token, kept as its last token; "length": it used up its budget
    stop_reason: int | None  # the stop token where it is one of stop_token_ids; None for the EOS token, as in vLLM
    logprobs: list[float] | None  # the processed log-prob of each sampled token
    ranks: list[int] | None  # each sampled token's rank in its distribution, 1 for the most likely
    top_logprobs: list[list[tuple[int, float]]] | None  # per token, the most likely (token id, log-prob) pairs


def completion(
    request: CompletionRequest,
    samples: list[Sample],
    version: str,
    scored: list[list | None],
    model: str,
    tokenizer,
) -> dict:
    """vLLM's CompletionResponse: choice `i * n + j` is `samples[i * n + j]`, the `j`-th completion of prompt `i`;
    `scored`: each prompt's prompt_logprobs (None where not asked for); `tokenizer` decodes as transformers' do."""
    rows = [prompt for prompt in request.prompts for _ in range(request.n)]
    prompt_tokens = sum(len(prompt) for prompt in request.prompts)
    completion_tokens = sum(len(sample.token_ids) for sample in samples)
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            _choice(index, row, sample, request, version, scored[index // request.n], tokenizer)
            for index, (row, sample) in enumerate(zip(rows, samples))
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def _choice(
    index: int,
    prompt: list[int],
    sample: Sample,
    request: CompletionRequest,
    version: str,
    scored: list | None,
    tokenizer,
) -> dict:
    """vLLM's CompletionResponseChoice for one sample (its text leaves out the stop token, as vLLM's does)."""
    drop_stop = sample.finish_reason == "stop" and not request.include_stop_str_in_output
    text_ids = sample.token_ids[:-1] if drop_stop else sample.token_ids
    return {
        "index": index,
        "text": tokenizer.decode(text_ids, skip_special_tokens=request.skip_special_tokens),
        "logprobs": None if request.logprobs is None else _completion_logprobs(sample, request, tokenizer),
        "finish_reason": sample.finish_reason,
        "stop_reason": sample.stop_reason,
        "token_ids": sample.token_ids if request.return_token_ids else None,
        "prompt_logprobs": scored,
        "prompt_token_ids": prompt if request.return_token_ids else None,
        "weight_versions": (
            [{"version": version, "start": 0, "end": len(sample.token_ids)}] if request.return_weight_versions else None
        ),
    }


def _completion_logprobs(sample: Sample, request: CompletionRequest, tokenizer) -> dict:
    """vLLM's CompletionLogProbs: per token its text, log-prob, offset in the text, and the top `logprobs` + 1."""

    def token(token_id: int) -> str:
        return f"token_id:{token_id}" if request.return_tokens_as_token_ids else tokenizer.decode([token_id])

    tokens = [token(token_id) for token_id in sample.token_ids]
    text_offset = list(itertools.accumulate((len(text) for text in tokens[:-1]), initial=0))
    top_logprobs = []
    for token_id, logprob, top in zip(sample.token_ids, sample.logprobs, sample.top_logprobs):
        candidates = {token_id: logprob}  # the sampled token first, then the most likely others
        for candidate, candidate_logprob in top:
            candidates.setdefault(candidate, candidate_logprob)
        kept = list(candidates.items())[: request.logprobs + 1]
        top_logprobs.append({token(candidate): max(value, LOGPROB_FLOOR) for candidate, value in kept})
    return {
        "text_offset": text_offset,
        "token_logprobs": [max(logprob, LOGPROB_FLOOR) for logprob in sample.logprobs],
        "tokens": tokens,
        "top_logprobs": top_logprobs,
    }


def chat_completion(response: dict) -> dict:
    """vLLM's ChatCompletionResponse, from the CompletionResponse of the rendered messages (without log-probs)."""
    for choice in response["choices"]:
        text = choice.pop("text")
        choice["message"] = {"role": "assistant", "content": text, "tool_calls": []}
        choice["logprobs"] = None
    response["id"] = "chat" + response["id"]
    response["object"] = "chat.completion"
    return response


def generated_tokens(
    request: CompletionRequest,
    samples: list[Sample],
    version: str,
    placeholders: list[tuple[int, int]],
    model: str,
) -> dict:
    """vLLM's GenerateTokensResponse: the `n` completions of the request's one prompt; `placeholders`: each image's
    (offset, length) in that prompt."""
    (prompt,) = request.prompts
    completion_tokens = sum(len(sample.token_ids) for sample in samples)
    return {
        "request_id": f"generate-tokens-{uuid.uuid4().hex}",
        "model": model,
        "created": int(time.time()),
        "usage": {
            "prompt_tokens": len(prompt),
            "completion_tokens": completion_tokens,
            "total_tokens": len(prompt) + completion_tokens,
        },
        "prompt_logprobs": None,
        "prompt_token_ids": prompt if request.return_token_ids else None,
        "mm_placeholders": (
            {"image": [{"offset": offset, "length": length} for offset, length in placeholders]}
            if request.return_token_ids and placeholders
            else None
        ),
        "output_mode": "tokens",
        "choices": [
            {
                "index": index,
                "logprobs": None if request.logprobs is None else tokens_route_logprobs(sample),
                "finish_reason": sample.finish_reason,
                "stop_reason": sample.stop_reason,
                "token_ids": sample.token_ids,
                "routed_experts": None,
                "sampling_mask": None,
                "weight_versions": [{"version": version, "start": 0, "end": len(sample.token_ids)}],
            }
            for index, sample in enumerate(samples)
        ],
    }


def tokens_route_logprobs(sample: Sample) -> dict:
    """vLLM's GenerateLogProbs: per sampled token its id, log-prob, rank and the most likely candidates, by id."""
    content = []
    for token_id, logprob, rank, top in zip(sample.token_ids, sample.logprobs, sample.ranks, sample.top_logprobs):
        candidates = {token_id: (logprob, rank)}  # the sampled token first, then the top ones, as vLLM returns them
        for candidate_rank, (candidate, candidate_logprob) in enumerate(top, start=1):
            candidates.setdefault(candidate, (candidate_logprob, candidate_rank))
        content.append(
            {
                "token_id": token_id,
                "logprob": max(logprob, LOGPROB_FLOOR),
                "rank": rank,
                "top_logprobs": [
                    {"token_id": candidate, "logprob": max(value, LOGPROB_FLOOR), "rank": candidate_rank}
                    for candidate, (value, candidate_rank) in candidates.items()
                ],
            }
        )
    return {"content": content}
