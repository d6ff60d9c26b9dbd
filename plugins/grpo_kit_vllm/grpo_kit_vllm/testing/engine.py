"""The CPU test server's engine: the model, its tokenizer (and processor, for images), and sampling with
transformers' `model.generate` in float32, as vLLM's engine samples (the differences are in server.py's list).

The request rules (protocol.py) and the answers' shapes (responses.py) need no model; this is the half that does:
tokenizing, images' pixel values and placeholders, sampling with log-probs, and loading and digesting weights, all
under one lock so that generation and weight loading take turns.
"""

import contextlib
import io
import threading
from http import HTTPStatus

import PIL.Image
import regex
import torch
import transformers

import grpo_kit
from grpo_kit_vllm import transport
from grpo_kit_vllm.testing import protocol, responses
from grpo_kit_vllm.testing.protocol import (
    DEFAULT_IMAGE_LIMIT,
    MODEL_SAMPLING_DEFAULTS,
    CompletionRequest,
    RequestError,
    ServedModel,
)
from grpo_kit_vllm.testing.responses import LOGPROB_FLOOR, Sample

INITIAL_WEIGHT_VERSION = "default"  # vLLM's engine starts with this label


def load_image(data: bytes) -> PIL.Image.Image:
    """An image from a data URL's bytes, in RGB; unreadable, a 400 with PIL's message, as vLLM's fetch_image_async
    turns it into a ValueError."""
    try:
        image = PIL.Image.open(io.BytesIO(data))
        image.load()
    except (PIL.UnidentifiedImageError, OSError) as error:
        raise RequestError(str(error)) from None
    return image.convert("RGB")


class Worker:
    """The model, its tokenizer (and processor, for images) and the lock that makes generation and weight loading
    take turns."""

    def __init__(self, model_path: str, seed: int, image_limit: int = DEFAULT_IMAGE_LIMIT):
        torch.manual_seed(seed)  # the server's own random stream, which unseeded requests continue
        self.image_limit = image_limit
        self.processor = grpo_kit.load_processor_at(model_path)  # None for a model that reads text alone
        if self.processor is not None:
            self.tokenizer = self.processor.tokenizer
            model_class = transformers.AutoModelForImageTextToText
        else:
            self.tokenizer = transformers.AutoTokenizer.from_pretrained(model_path)
            model_class = transformers.AutoModelForCausalLM
        self.model = model_class.from_pretrained(model_path, dtype=torch.float32).eval()
        model_generation = self.model.generation_config.to_diff_dict()
        self.eos_token_id = self.tokenizer.eos_token_id
        # vLLM stops on the generation config's other EOS ids as if they were stop_token_ids (unless ignore_eos).
        configured_eos = model_generation.get("eos_token_id")
        configured_eos = [configured_eos] if isinstance(configured_eos, int) else configured_eos or []
        self.served = ServedModel(
            name=model_path,  # vllm serve serves a model under the path it was given
            max_model_len=self.model.config.get_text_config().max_position_embeddings,
            vocab_size=self.model.get_input_embeddings().num_embeddings,
            sampling_defaults={
                name: model_generation[name]
                for name in MODEL_SAMPLING_DEFAULTS
                if model_generation.get(name) is not None
            },
            extra_eos_ids=frozenset(configured_eos) - {self.eos_token_id},
            image_token=getattr(self.model.config, "image_token_id", None) if self.processor else None,
        )
        # Nothing else of generation_config.json reaches vLLM's sampler; without this, generate() would apply it.
        self.model.generation_config = transformers.GenerationConfig()
        pad = self.tokenizer.pad_token_id
        self.pad_token_id = pad if pad is not None else (self.eos_token_id if self.eos_token_id is not None else 0)
        # Every tensor a trainer may send, by its checkpoint name, a tied `lm_head.weight` too; loaded in place.
        # Parameters only: vLLM's models load no buffer (AutoWeightsLoader refuses any other name).
        self.targets = dict(self.model.named_parameters(remove_duplicate=False))
        self.lock = threading.Lock()
        self.weight_version = INITIAL_WEIGHT_VERSION
        self.spent = False  # a weight update failed: vLLM's model is left half loaded, and its engine dies

    # --- requests ---

    def parse(self, body: dict) -> CompletionRequest:
        """A /v1/completions request, checked against this model as vLLM checks it."""
        return protocol.parse_completion(body, self.served, self.tokenizer)

    def chat_prompt(self, messages) -> str:
        """The messages rendered with the tokenizer's chat template, as vLLM's chat route renders them."""
        protocol.check_messages(messages)
        if self.tokenizer.chat_template is None:
            raise RequestError(protocol.NO_CHAT_TEMPLATE)
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    def parse_generate(self, body: dict) -> tuple[CompletionRequest, dict[str, torch.Tensor], list[tuple[int, int]]]:
        """vLLM's GenerateRequest, checked as vLLM checks it: the sampling settings, and the prompt with its images
        expanded; the vision inputs for the model, and each image's placeholder as (offset, length)."""
        token_ids, parts, sampling = protocol.generate_prompt(body)
        images = protocol.images(
            parts, multimodal=self.processor is not None, image_limit=self.image_limit, load=load_image
        )
        vision, placeholders = {}, []
        if images:
            token_ids, vision, placeholders = self._expand(token_ids, images)
        protocol.refuse_unexpanded_image_tokens([protocol.strip(token_ids, placeholders)], self.served.image_token)
        fields = protocol.generate_fields(body, sampling, token_ids, self.served.max_model_len)
        return self.parse(fields), vision, placeholders

    def _expand(
        self, token_ids: list[int], images: list[PIL.Image.Image]
    ) -> tuple[list[int], dict[str, torch.Tensor], list[tuple[int, int]]]:
        """The prompt as vLLM expands it: image i replaces the next image token after image i - 1's with its
        grid's merged patches' tokens (BaseMultiModalProcessor._apply_prompt_updates, Qwen2-VL's replacement)."""
        image_token = self.served.image_token
        vision = dict(self.processor.image_processor(images=images, return_tensors="pt"))
        merge = self.processor.image_processor.merge_size
        expanded, placeholders, start = [], [], 0
        for grid in vision["image_grid_thw"]:
            found = next((i for i in range(start, len(token_ids)) if token_ids[i] == image_token), None)
            if found is None:
                break
            length = int(grid.prod()) // merge**2
            expanded += token_ids[start:found]
            placeholders.append((len(expanded), length))
            expanded += [image_token] * length
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

    # --- sampling ---

    def generate_tokens(
        self, request: CompletionRequest, vision: dict[str, torch.Tensor], placeholders: list[tuple[int, int]]
    ) -> dict:
        """vLLM's GenerateTokensResponse: the `n` completions of the request's one prompt, sampled with its images."""
        (prompt,) = request.prompts
        rows = [prompt] * request.n
        # Every row carries the prompt's images: the model takes one set of pixel values per image per row.
        vision = {name: torch.cat([tensor] * request.n) for name, tensor in vision.items()}
        budget = min(request.max_tokens, self.served.max_model_len - len(prompt))
        with self.lock, _seeded(request.seed):
            samples = self._generate(rows, [budget] * len(rows), request, vision)
            version = self.weight_version
        return responses.generated_tokens(request, samples, version, placeholders, self.served.name)

    def complete(self, request: CompletionRequest) -> dict:
        """vLLM's CompletionResponse for `request`: choice `i * n + j` is the `j`-th completion of prompt `i`."""
        rows = [prompt for prompt in request.prompts for _ in range(request.n)]
        budgets = [min(request.max_tokens, self.served.max_model_len - len(prompt)) for prompt in rows]
        # transformers' repetition penalty also counts a left-padded row's pad tokens: with a penalty, generate each
        # prompt's rows apart (they share a length, so need no padding).
        batch_size = len(rows) if request.repetition_penalty == 1 else request.n
        samples = []
        with self.lock, _seeded(request.seed):
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
        return responses.completion(request, samples, version, scored, self.served.name, self.tokenizer)

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
        constraints = transformers.LogitsProcessorList()
        if request.regex is not None:
            constraints.append(RegexConstraint(request.regex, self.tokenizer, width, stop_ids))
        output = self.model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            generation_config=config,
            logits_processor=constraints,
            **(vision or {}),
        )
        generated = output.sequences[:, width:]
        if request.logprobs is not None:
            sampled_logprobs, sampled_ranks, top = _step_logprobs(output.scores, generated, request.logprobs)
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


@contextlib.contextmanager
def _seeded(seed: int | None):
    """With a seed, the request's own random stream, leaving the server's untouched; without, the server's."""
    if seed is None:
        yield
        return
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


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


class RegexConstraint(transformers.LogitsProcessor):
    """vLLM's structured outputs with a regex, for this server's small vocabularies: each step, every token that
    would take the completion's text off every match of the pattern is masked, and a stop token is allowed once the
    text is a whole match (or nothing else is). transformers runs it before temperature, top-k and top-p, as vLLM
    applies its grammar's bitmask before its sampler, so the log-probs returned are the constrained distribution's.

    It decodes each candidate continuation whole (not token texts joined), so a tokenizer whose tokens decode
    differently in context is matched right; that costs a decode per vocabulary entry per step.
    """

    def __init__(self, pattern: str, tokenizer, prompt_width: int, stop_ids: set[int]):
        self.pattern = regex.compile(pattern)  # protocol.structured_regex has compiled it
        self.tokenizer, self.prompt_width, self.stop_ids = tokenizer, prompt_width, stop_ids
        self.special = set(tokenizer.all_special_ids) - stop_ids  # never text the pattern could match

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        allowed = torch.zeros_like(scores, dtype=torch.bool)  # (B, V)
        for row, ids in enumerate(input_ids[:, self.prompt_width :].tolist()):
            if any(token in self.stop_ids for token in ids):  # finished: transformers pads it, whatever is allowed
                allowed[row] = True
                continue
            allowed[row] = self._allowed(ids, scores.shape[-1])
        return scores.masked_fill(~allowed, -float("inf"))

    def _allowed(self, ids: list[int], vocab: int) -> torch.Tensor:  # (V,)
        allowed = torch.zeros(vocab, dtype=torch.bool)
        written = self.tokenizer.decode(ids, skip_special_tokens=False)
        for token in range(vocab):
            if token in self.stop_ids or token in self.special:
                continue
            text = self.tokenizer.decode(ids + [token], skip_special_tokens=False)
            # A token that writes nothing (an id past the tokenizer's, in a padded embedding) would never end.
            allowed[token] = text != written and self.pattern.fullmatch(text, partial=True) is not None
        whole = self.pattern.fullmatch(written) is not None
        if whole or not allowed.any():
            allowed[[token for token in self.stop_ids if token < vocab]] = True
        return allowed
