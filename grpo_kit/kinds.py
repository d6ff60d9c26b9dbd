"""What a plugin of each kind is handed and returns.

Shapes: B completions in a micro-batch, T completion tokens, N completions in a generation batch, K rewards.
These are Protocols: a plugin implements the methods, it does not need to inherit from anything. The config
base classes (``GenerationConfig``, ``RewardConfig``) are the exception: the core reads their fields, so a
generation or reward plugin's config extends them.
"""

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import torch

KINDS = ("loss", "importance_sampling", "rollout_correction", "advantage", "reward", "generation")


@dataclass(frozen=True)
class Reduction:
    """What a loss may divide by when it reduces per-token losses to the micro-batch's scalar."""

    num_items_in_batch: float  # active completion tokens in the whole generation batch, all processes
    gradient_accumulation_steps: int
    steps_per_generation: int
    num_processes: int
    max_completion_length: int


class Loss(Protocol):
    # The importance-sampling level the loss is defined on ("sequence" for LUSPO); None accepts either.
    importance_sampling_level: ClassVar[str | None]

    def per_token_loss(
        self,
        log_weights: torch.Tensor,  # (B, T) or (B, 1)
        advantages: torch.Tensor,  # (B, 1)
        per_token_logps: torch.Tensor,  # (B, T)
        mask: torch.Tensor,  # (B, T)
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:  # (B, T) loss, metrics as masked means
        ...

    def reduce(self, per_token_loss: torch.Tensor, mask: torch.Tensor, reduction: Reduction) -> torch.Tensor: ...


class ImportanceSampling(Protocol):
    def log_weights(self, log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:  # (B, T) or (B, 1)
        ...


class RolloutCorrection(Protocol):
    def ratio(
        self,
        old_per_token_logps: torch.Tensor,  # (N, T)
        sampling_per_token_logps: torch.Tensor,  # (N, T)
        mask: torch.Tensor,  # (N, T)
    ) -> torch.Tensor | None:  # (N, T) or (N, 1); None: no correction
        ...


class Advantage(Protocol):
    def __call__(
        self,
        rewards_per_func: torch.Tensor,  # (N, K), NaN where a reward had no opinion
        weights: torch.Tensor,  # (K,)
        num_generations: int,
    ) -> torch.Tensor:  # (N,)
        ...


@dataclass
class GenerationConfig:
    """Sampling settings every generation backend understands; a backend's own config extends this."""

    num_generations: int = 8
    max_completion_length: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float = 1.0


@dataclass
class Completions:
    completion_ids: torch.Tensor  # (N, T), right-padded
    completion_mask: torch.Tensor  # (N, T), 1 up to and including the first EOS
    is_truncated: torch.Tensor  # (N,), True where no EOS came before max_completion_length
    sampling_per_token_logps: torch.Tensor | None = None  # (N, T), the sampler's own log-probs


class Generation(Protocol):
    def start(self, model: torch.nn.Module, tokenizer: Any, accelerator: Any) -> None: ...

    def generate(self, prompt_ids: list[list[int]]) -> Completions:
        """One completion for each prompt (prompts arrive already repeated num_generations times)."""

    def update_weights(self, model: torch.nn.Module) -> None:
        """Called after every optimizer step; a backend outside this process loads the new weights here."""

    def close(self) -> None: ...


@dataclass
class RewardConfig:
    """Every reward's config extends this; the other fields reach the reward function as keyword arguments."""

    weight: float = 1.0
