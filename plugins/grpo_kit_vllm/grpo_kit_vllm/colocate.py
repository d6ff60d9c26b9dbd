"""vllm_colocate: a vLLM engine inside each training process, sharing its GPU; weights loaded in place each step.

vLLM is imported when a run starts the engine, so this module (and listing plugins) works without it. The engine
runs under vLLM's `external_launcher` executor: the training processes themselves are its workers, and each group
of `tensor_parallel_size` consecutive processes shares one engine (they gather their prompts, generate together,
and each keeps its own completions). After every optimizer step the trained weights are handed to the engine's
model with `load_weights`, in memory; vLLM's argument-less reload would re-read the checkpoint from disk instead.

With `sleep_level` the engine sleeps from the end of each generation until it is needed again: level 1 moves its
weights to CPU memory and drops its KV cache, level 2 drops the weights too, and they are loaded again from the
policy before the next generation.
"""

import os
import socket
from typing import ClassVar

import torch

from grpo_kit import Completions, PromptImages, eos_token_ids
from grpo_kit.contract.distributed import weights_are_sharded
from grpo_kit.contract.errors import ConfigError
from grpo_kit_vllm.completions import Sample, sampling, sampling_fields, to_completions
from grpo_kit_vllm.config import VLLMColocateConfig
from grpo_kit_vllm.images import collapse_image_placeholders, image_token_id
from grpo_kit_vllm.weights import base_model_path, named_weights


def import_vllm():
    try:
        import vllm
    except ImportError:
        raise ConfigError(
            "generation=vllm_colocate runs vLLM in the training processes, and vLLM is not installed: "
            "pip install 'grpo-kit-vllm[vllm]' on a machine with CUDA GPUs. Without GPUs, try server mode against "
            "the CPU test server: generation=vllm_server generation.launch=test."
        ) from None
    return vllm


class VLLMColocateGeneration:
    accepts_images: ClassVar[bool] = True

    def __init__(self, config: VLLMColocateConfig):
        self.config = config

    def start(self, model, tokenizer, accelerator):
        self.vllm = vllm = import_vllm()
        if not torch.cuda.is_available():
            raise ConfigError("generation=vllm_colocate needs CUDA GPUs: on CPU use generation=transformers.")
        size = self.config.tensor_parallel_size
        if accelerator.num_processes % size:
            raise ConfigError(
                f"generation.tensor_parallel_size={size} must divide the {accelerator.num_processes} training "
                "processes: each group of that many processes shares one vLLM engine."
            )
        self.model, self.tokenizer, self.accelerator = model, tokenizer, accelerator
        self.eos_token_ids = eos_token_ids(accelerator.unwrap_model(model), tokenizer)
        self.tp_group = tensor_parallel_group(accelerator, size)
        # external_launcher reads the torch.distributed rendezvous from the environment, as torchrun sets it.
        os.environ.setdefault("RANK", str(accelerator.process_index))
        os.environ.setdefault("LOCAL_RANK", str(accelerator.local_process_index))
        os.environ.setdefault("WORLD_SIZE", str(accelerator.num_processes))
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")  # one process started without a launcher
        os.environ.setdefault("MASTER_PORT", str(free_port()))
        self.llm = vllm.LLM(
            model=base_model_path(accelerator.unwrap_model(model)),
            tensor_parallel_size=size,
            gpu_memory_utilization=self.config.gpu_memory_utilization,
            max_model_len=self.config.max_model_len,
            max_num_batched_tokens=self.config.max_num_batched_tokens,
            dtype=self.config.dtype,
            enforce_eager=self.config.enforce_eager,
            enable_sleep_mode=self.config.sleep_level > 0,
            distributed_executor_backend="external_launcher",
            seed=self.config.seed + accelerator.process_index // size,  # one seed per engine: its ranks agree
            logprobs_mode="processed_logprobs",  # the sampled distribution's log-probs, for rollout corrections
        )
        self.asleep: set[str] = set()  # what vLLM's sleep mode has put away: "weights", "kv_cache"
        self.update_weights(model, step=0)  # the engine loaded the checkpoint; the run may start elsewhere

    sampling = sampling

    @torch.no_grad()
    def generate(
        self, prompt_ids: list[list[int]], with_logprobs: bool = False, images: PromptImages | None = None
    ) -> Completions:
        # The engine processes the images itself (its processor rebuilds the pixel values): it takes them as PIL
        # images, not the trainer's `images.model_inputs`.
        prompts = list(zip(prompt_ids, images.images if images is not None else [[] for _ in prompt_ids]))
        every = [prompts]
        if self.tp_group is not None:  # the group's engine generates for all its processes' prompts
            every = [None] * self.config.tensor_parallel_size
            torch.distributed.all_gather_object(every, prompts, group=self.tp_group)
        fields = sampling_fields(self.config, self.eos_token_ids, with_logprobs) | (self.config.generation_kwargs or {})
        if self.config.sleep_level == 2 and "weights" in self.asleep:  # dropped since the last update_weights
            self._wake("weights")
            self._load(self.model)
        self._wake("weights", "kv_cache")
        outputs = self.llm.generate(
            [self._engine_prompt(ids, prompt_images) for prompts in every for ids, prompt_images in prompts],
            self.vllm.SamplingParams(n=1, **engine_fields(fields)),
            use_tqdm=False,
        )
        if self.config.sleep_level:
            self.llm.sleep(level=self.config.sleep_level)
            self.asleep = {"weights", "kv_cache"}
        samples = [sample_of(output.outputs[0]) for output in outputs]
        if self.tp_group is not None:
            start = sum(len(prompts) for prompts in every[: torch.distributed.get_rank(self.tp_group)])
            samples = samples[start : start + len(prompt_ids)]
        return to_completions(
            samples, self.eos_token_ids, self.tokenizer.pad_token_id, with_logprobs, self.accelerator.device
        )

    def _engine_prompt(self, ids: list[int], images: list) -> dict:
        """vLLM's TokensPrompt: token ids, and with images `multi_modal_data`, each image's placeholder collapsed
        to the one token vLLM expands itself (images.py)."""
        if not images:
            return {"prompt_token_ids": ids}
        image_token = image_token_id(self.accelerator.unwrap_model(self.model))
        return {
            "prompt_token_ids": collapse_image_placeholders(ids, image_token, len(images)),
            "multi_modal_data": {"image": list(images)},
        }

    def update_weights(self, model, step: int) -> None:
        self._wake("weights")
        self._load(model)

    def _load(self, model) -> None:
        """The policy's current weights into the engine's model, in memory (every process calls it)."""
        if weights_are_sharded(self.accelerator):  # gathered whole on the main process, then sent to every engine
            weights = broadcast_weights(dict(named_weights(model, self.accelerator)), self.accelerator)
        else:  # every process holds the whole, identical weights
            weights = dict(named_weights(model, self.accelerator, on_every_process=True))
        engine_model = self.llm.llm_engine.model_executor.driver_worker.model_runner.model
        engine_model.load_weights(weights.items())
        self.llm.reset_prefix_cache()  # cached prefixes were computed with the old weights

    def _wake(self, *tags: str) -> None:
        if sleeping := [tag for tag in tags if tag in self.asleep]:
            self.llm.wake_up(tags=sleeping)
            self.asleep -= set(sleeping)

    def close(self):
        self.llm = None


def sample_of(output) -> Sample:
    """A vllm.CompletionOutput as a Sample: its tokens (EOS kept) and their log-probs."""
    logprobs = None
    if output.logprobs is not None:
        logprobs = [position[token].logprob for token, position in zip(output.token_ids, output.logprobs)]
    return Sample(list(output.token_ids), logprobs)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def tensor_parallel_group(accelerator, size: int):
    """This process's group of `size` consecutive processes (every process creates every group, as torch needs)."""
    if size == 1:
        return None
    groups = [
        torch.distributed.new_group(list(range(first, first + size)))
        for first in range(0, accelerator.num_processes, size)
    ]
    return groups[accelerator.process_index // size]


def broadcast_weights(weights: dict, accelerator) -> dict:
    """The main process's whole weights (`weights`, empty elsewhere) on every process."""
    layout = [[(name, tuple(tensor.shape), tensor.dtype) for name, tensor in weights.items()]]
    torch.distributed.broadcast_object_list(layout, src=0)
    received = {}
    for name, shape, dtype in layout[0]:
        tensor = weights[name] if name in weights else torch.empty(shape, dtype=dtype)
        tensor = tensor.to(accelerator.device).contiguous()
        torch.distributed.broadcast(tensor, src=0)
        received[name] = tensor
    return received


def engine_fields(fields: dict) -> dict:
    """`fields` as vllm.SamplingParams takes them: structured outputs as its StructuredOutputsParams, which the
    engine reads by attribute, where a server's request parser builds it from the JSON object itself."""
    structured = fields.get("structured_outputs")
    if not isinstance(structured, dict):
        return fields
    from vllm.sampling_params import StructuredOutputsParams  # vLLM is there: the engine runs

    return fields | {"structured_outputs": StructuredOutputsParams(**structured)}
