"""transformers: completions from the policy itself with `model.generate` (KV cache), in the training process.

Nothing has to be pushed after an optimizer step: the generator samples from the very weights being trained. A
LoRA policy may instead generate from a merged copy (`generation.merge_lora=true`), whose weights are refreshed
after every optimizer step: generation then costs what the plain model costs, for one more copy in memory.
"""

import copy
from dataclasses import dataclass
from typing import Any

import torch
import transformers

from grpo_kit import Completions, GenerationConfig
from grpo_kit.lora import has_adapters, merged_copy, refresh_merged_copy


@dataclass
class TransformersGenerationConfig(GenerationConfig):
    cache_implementation: str | None = None  # e.g. "static"; None: transformers' dynamic KV cache
    generation_kwargs: Any = None  # a dict of any other GenerationConfig fields, applied last
    merge_lora: bool = False  # generate from a copy with the LoRA adapters merged into the weights


class TransformersGeneration:
    def __init__(self, config: TransformersGenerationConfig):
        self.config = config

    def start(self, model, tokenizer, accelerator):
        self.model, self.tokenizer, self.accelerator = model, tokenizer, accelerator
        self.merged = None
        if self.config.merge_lora:
            unwrapped = accelerator.unwrap_model(model)
            if not has_adapters(unwrapped):
                raise ValueError("generation.merge_lora=true merges LoRA adapters: turn on model.lora.enabled=true.")
            self.merged = merged_copy(unwrapped)
        self.generation_config = transformers.GenerationConfig(
            max_new_tokens=self.config.max_completion_length,
            do_sample=True,
            temperature=self.config.temperature,
            top_p=self.config.top_p,
            top_k=self.config.top_k or 0,  # 0 turns top-k filtering off
            min_p=self.config.min_p,
            repetition_penalty=self.config.repetition_penalty,
            cache_implementation=self.config.cache_implementation,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            bos_token_id=tokenizer.bos_token_id,
            disable_compile=True,  # compiling pays off only for long runs on a GPU
            return_dict_in_generate=True,
            **(self.config.generation_kwargs or {}),
        )
        # The logits after temperature, top-k and top-p are the sampling distribution: kept for a rollout correction.
        self.generation_config_with_scores = copy.deepcopy(self.generation_config)
        self.generation_config_with_scores.output_scores = True

    @torch.no_grad()
    def generate(self, prompt_ids, with_logprobs=False):
        prompts = self.tokenizer.pad({"input_ids": prompt_ids}, padding_side="left", return_tensors="pt")
        prompts = prompts.to(self.accelerator.device)
        model = self.accelerator.unwrap_model(self.model) if self.merged is None else self.merged
        config = self.generation_config_with_scores if with_logprobs else self.generation_config
        out = model.generate(**prompts, generation_config=config)
        completion_ids = out.sequences[:, prompts["input_ids"].shape[1] :]  # (N, T)

        is_eos = completion_ids == self.tokenizer.eos_token_id
        has_eos = is_eos.any(dim=1)
        first_eos = torch.where(has_eos, is_eos.int().argmax(dim=1), completion_ids.shape[1])  # (N,)
        positions = torch.arange(completion_ids.shape[1], device=completion_ids.device)
        completion_mask = (positions.unsqueeze(0) <= first_eos.unsqueeze(1)).int()  # (N, T), EOS included
        completion_ids = completion_ids.masked_fill(completion_mask == 0, self.tokenizer.pad_token_id)
        sampling_logps = None
        if with_logprobs:
            scores = torch.stack(out.scores, dim=1).float()  # (N, T, V)
            sampling_logps = scores.log_softmax(-1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
            sampling_logps = sampling_logps.masked_fill(completion_mask == 0, 0.0)
        return Completions(completion_ids, completion_mask, ~has_eos, sampling_per_token_logps=sampling_logps)

    def update_weights(self, model):
        if self.merged is not None:  # otherwise generation reads the trained model directly
            refresh_merged_copy(self.accelerator.unwrap_model(model), self.merged)

    def close(self):
        pass
