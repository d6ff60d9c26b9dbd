"""transformers: completions from the policy itself, in the training process.

Three loops sample what `model.generate` samples (`generation.loop`):
- on a CPU, by default, a lean loop (sampling.py) whose finished rows leave the batch, for less time;
- on a CUDA GPU, by default, a static loop (static.py) of fixed shapes and no host sync inside a decode step,
  recorded once per generation batch as a CUDA graph and replayed;
- `model.generate` itself, for everything else, and wherever a loop does not cover the run: sharded weights,
  prompts with images, settings neither loop implements (it says which, once).

Under mixed precision (bf16, fp16), each loop samples with the linear layers' weights cast once per generation batch
(cast_once.py), where accelerate's autocast would cast them again at every token.

Nothing has to be pushed after an optimizer step: the generator samples from the very weights being trained. A
LoRA policy may instead generate from a merged copy (`generation.merge_lora=true`), whose weights are refreshed
after every optimizer step: generation then costs what the plain model costs, for one more copy in memory.

Every process generates for its own prompts. Where FSDP or DeepSpeed ZeRO-3 split the weights between processes,
`generate` needs them whole: ZeRO-3's are gathered around the call (TRL's `ds3_gather_for_generation`), FSDP1's
root is summoned, and FSDP2 gathers each layer in that layer's own forward pass. Those gathers are collective, so
processes whose completions have all ended keep stepping until every process is done (`synced_gpus`).
"""

import contextlib
import copy
import logging

import torch
import transformers
from accelerate.utils import DistributedType

from grpo_kit import Completions, PromptImages, eos_mask, eos_token_ids, is_truncated
from grpo_kit.contract.distributed import weights_are_sharded
from grpo_kit.contract.lora import has_adapters, merged_copy, refresh_merged_copy
from grpo_kit_transformers.cast_once import autocast_dtype, weights_cast_once
from grpo_kit_transformers.configs import TransformersGenerationConfig
from grpo_kit_transformers.logprobs import sampled_logps_recorded
from grpo_kit_transformers.sampling import sample, why_not_lean
from grpo_kit_transformers.static import StaticDecoder, why_not_static

log = logging.getLogger(__name__)


class TransformersGeneration:
    accepts_images = True  # a vision-language policy's images reach `generate` as its processor's tensors

    def __init__(self, config: TransformersGenerationConfig):
        self.config = config

    def start(self, model, tokenizer, accelerator):
        self.model, self.tokenizer, self.accelerator = model, tokenizer, accelerator
        self.merged = None
        if self.config.merge_lora:
            unwrapped = accelerator.unwrap_model(model)
            if not has_adapters(unwrapped):
                raise ValueError("generation.merge_lora=true merges LoRA adapters: turn on model.lora.enabled=true.")
            if weights_are_sharded(accelerator):
                raise ValueError(
                    "generation.merge_lora=true keeps a whole merged copy of the model on every process, which FSDP "
                    "and DeepSpeed ZeRO-3 split between processes: leave it off (generation then reads the sharded "
                    "LoRA policy itself), or train with DDP or ZeRO-2."
                )
            self.merged = merged_copy(unwrapped)
        # Where weights are sharded, a forward pass may gather them: a collective every process must join.
        self.synced_gpus = weights_are_sharded(accelerator) and accelerator.num_processes > 1
        self.eos_token_ids = eos_token_ids(accelerator.unwrap_model(model), tokenizer)
        settings = dict(
            max_new_tokens=self.config.max_completion_length,
            do_sample=True,
            temperature=self.config.temperature,
            top_p=self.config.top_p,
            top_k=self.config.top_k or 0,  # 0 turns top-k filtering off
            min_p=self.config.min_p,
            repetition_penalty=self.config.repetition_penalty,
            cache_implementation=self.config.cache_implementation,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=self.eos_token_ids,
            bos_token_id=tokenizer.bos_token_id,
            disable_compile=True,  # compiling pays off only for long runs on a GPU
            return_dict_in_generate=True,
        )
        # Last, as TRL applies them: a key set above is overridden, not refused.
        settings.update(self.config.generation_kwargs or {})
        self.generation_config = transformers.GenerationConfig(**settings)
        self.loop = chosen_loop(self.config, accelerator.device.type)
        if self.loop != "generate":
            why_not = why_not_lean if self.loop == "lean" else why_not_static
            reason = "the weights are sharded" if weights_are_sharded(accelerator) else None
            reason = reason or why_not(accelerator.unwrap_model(model), self.generation_config)
            if reason is not None:
                log.warning("generation.loop=%s: model.generate samples instead, because %s.", self.loop, reason)
                self.loop = "generate"
        self.static = StaticDecoder()
        # Sharded weights are gathered inside each forward pass: there is no whole weight to cast once.
        self.cast_dtype = None if weights_are_sharded(accelerator) else autocast_dtype(accelerator)

    @torch.no_grad()
    def generate(self, prompt_ids, with_logprobs=False, images: PromptImages | None = None):
        prompts = self.tokenizer.pad({"input_ids": prompt_ids}, padding_side="left", return_tensors="pt")
        prompts = prompts.to(self.accelerator.device)
        model = self.accelerator.unwrap_model(self.model) if self.merged is None else self.merged
        if images is not None:
            prompts |= images.forward_kwargs(model, prompts["input_ids"])
        with weights_cast_once(model, self.accelerator.device.type, self.cast_dtype):
            completion_ids, sampling_logps = self._sample(model, prompts, with_logprobs, images is not None)

        completion_mask = eos_mask(completion_ids, self.eos_token_ids)  # (N, T), EOS included
        completion_ids = completion_ids.masked_fill(completion_mask == 0, self.tokenizer.pad_token_id)
        if sampling_logps is not None:
            sampling_logps = sampling_logps.masked_fill(completion_mask == 0, 0.0)
        truncated = is_truncated(completion_ids, completion_mask, self.eos_token_ids, self.tokenizer.pad_token_id)
        return Completions(completion_ids, completion_mask, truncated, sampling_per_token_logps=sampling_logps)

    def _sample(self, model, prompts, with_logprobs, with_images: bool):
        # `generate` numbers a vision-language model's positions over the image tokens (M-RoPE), which the other
        # loops' plain positions do not.
        if self.loop == "generate" or with_images:
            return self._generate(model, prompts, with_logprobs)
        if self.loop == "lean":
            return sample(model, prompts["input_ids"], prompts["attention_mask"], self.generation_config, with_logprobs)
        if self.loop == "static":
            return self.static.sample(
                model, prompts["input_ids"], prompts["attention_mask"], self.generation_config, with_logprobs
            )
        raise AssertionError(f"unknown loop {self.loop}")

    def _generate(self, model, prompts, with_logprobs):
        """`model.generate`'s completions (N, T), and when asked their tokens' log-probs under the processed
        distribution each was drawn from (N, T), gathered at each step rather than from all the steps' scores."""
        kwargs = dict(**prompts, generation_config=self.generation_config, synced_gpus=self.synced_gpus)
        with self.whole_weights(), sampled_logps_recorded(model, with_logprobs) as recorded:
            if self.accelerator.is_fsdp2 and has_adapters(model):
                out = inside_root_forward(model, model.generate, **kwargs)
            else:
                out = model.generate(**kwargs)
        completion_ids = out.sequences[:, prompts["input_ids"].shape[1] :]  # (N, T)
        return completion_ids, None if recorded is None else recorded.logps(completion_ids)

    def whole_weights(self):
        """A context in which `generate` sees the whole weights, as accelerate's FSDP and DeepSpeed leave them."""
        state = self.accelerator.state
        if state.distributed_type == DistributedType.DEEPSPEED and state.deepspeed_plugin.zero_stage == 3:
            import deepspeed

            return deepspeed.zero.GatheredParameters(
                self.model.parameters(), enabled=self.config.ds3_gather_for_generation
            )
        if state.distributed_type == DistributedType.FSDP and state.fsdp_plugin.fsdp_version == 1:
            from torch.distributed.fsdp import FullyShardedDataParallel

            return FullyShardedDataParallel.summon_full_params(self.model, recurse=False)
        return contextlib.nullcontext()  # DDP, ZeRO-1/2: whole weights on every process; FSDP2: see the docstring

    @contextlib.contextmanager
    def sampling(self, temperature, top_p):
        """Evaluation's own temperature and top-p (None: the run's) for the generation calls inside: warpers that
        every loop applies as `generate` does."""
        saved = self.generation_config
        self.generation_config = with_sampling(saved, temperature, top_p)
        try:
            yield
        finally:
            self.generation_config = saved

    def update_weights(self, model, step):
        if self.merged is not None:  # otherwise generation reads the trained model directly
            refresh_merged_copy(self.accelerator.unwrap_model(model), self.merged)

    def close(self):
        pass


def chosen_loop(config: TransformersGenerationConfig, device_type: str) -> str:
    """The loop `generation.loop` names; for auto, the one measured fastest on this kind of device: lean on a CPU,
    static on a CUDA GPU, `generate` where a KV cache of its own was asked for, and on other devices."""
    if config.loop != "auto":
        return config.loop
    if config.cache_implementation is not None:
        return "generate"
    return {"cpu": "lean", "cuda": "static"}.get(device_type, "generate")


def with_sampling(config: transformers.GenerationConfig, temperature: float | None, top_p: float | None):
    """`config` with this temperature and top-p; None keeps its own."""
    changed = copy.deepcopy(config)
    changed.temperature = config.temperature if temperature is None else temperature
    changed.top_p = config.top_p if top_p is None else top_p
    return changed


def inside_root_forward(root: torch.nn.Module, method, **kwargs):
    """`method(**kwargs)` run as the forward pass of `root`, so that the hooks around it run around `method`.

    PEFT's `generate` calls the base model below the PEFT model, which FSDP2 made its root: FSDP2 gathers a layer's
    weights only within a forward pass of its root module.
    """

    def forward(*_, **__):
        del root.forward  # the class's own forward again, for any call inside `method`
        return method(**kwargs)

    root.forward = forward
    try:
        return root()
    finally:
        root.__dict__.pop("forward", None)
