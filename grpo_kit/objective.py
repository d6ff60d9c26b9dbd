"""The objective on one micro-batch, tensors only: importance weights -> loss -> masks / KL -> reduction.

The loss, the importance-sampling level and the rollout correction are plugins; this file is the order in
which they are applied, the same order as TRL's GRPOTrainer.
"""

from dataclasses import dataclass, field

import torch
from omegaconf import OmegaConf

from grpo_kit.config import AlgorithmConfig, options
from grpo_kit.kinds import ImportanceSampling, Loss, Reduction, RolloutCorrection
from grpo_kit.plugins import PluginError, Registry
from grpo_kit.reductions import masked_mean


@dataclass
class ObjectiveOutput:
    loss: torch.Tensor  # scalar, already scaled for gradient accumulation
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class Objective:
    loss: Loss
    importance_sampling: ImportanceSampling
    correction: RolloutCorrection
    algorithm: AlgorithmConfig
    max_completion_length: int

    def __call__(
        self,
        per_token_logps: torch.Tensor,  # (B, T), log pi_theta of the completion tokens, with gradient
        entropies: torch.Tensor,  # (B, T)
        batch: dict[str, torch.Tensor],
        gradient_accumulation_steps: int = 1,
        steps_per_generation: int = 1,
        num_processes: int = 1,
    ) -> ObjectiveOutput:
        mask = batch["completion_mask"].to(per_token_logps.dtype)  # (B, T)
        advantages = batch["advantages"].unsqueeze(1)  # (B, 1)
        old_per_token_logps = batch.get("old_per_token_logps")
        if old_per_token_logps is None:  # on-policy: pi_old is pi_theta, without its gradient
            old_per_token_logps = per_token_logps.detach()

        log_weights = self.importance_sampling.log_weights(per_token_logps - old_per_token_logps, mask)
        per_token_loss, metrics = self.loss.per_token_loss(log_weights, advantages, per_token_logps, mask)

        reduction = Reduction(
            num_items_in_batch=float(batch.get("num_items_in_batch", mask.sum())),
            gradient_accumulation_steps=gradient_accumulation_steps,
            steps_per_generation=steps_per_generation,
            num_processes=num_processes,
            max_completion_length=self.max_completion_length,
        )
        loss = self.loss.reduce(per_token_loss, mask, reduction)
        metrics["entropy"] = masked_mean(entropies, mask)
        return ObjectiveOutput(loss, {name: value.detach() for name, value in metrics.items()})

    def rollout_correction(self, old_per_token_logps, sampling_per_token_logps, completion_mask):
        return self.correction.ratio(old_per_token_logps, sampling_per_token_logps, completion_mask)


def build_objective(cfg, registry: Registry | None = None) -> Objective:
    """The objective a composed config describes (see grpo_kit.compose)."""
    registry = registry or Registry()
    loss = registry.build("loss", cfg.loss.name, options(cfg.loss))
    level = cfg.importance_sampling.name
    required = getattr(loss, "importance_sampling_level", None)
    if required is not None and required != level:
        raise PluginError(
            f"loss {cfg.loss.name!r} is defined on {required}-level importance weights, but importance_sampling="
            f"{level}: add importance_sampling={required}."
        )
    return Objective(
        loss=loss,
        importance_sampling=registry.build("importance_sampling", level, options(cfg.importance_sampling)),
        correction=registry.build("rollout_correction", cfg.rollout_correction.name, options(cfg.rollout_correction)),
        algorithm=OmegaConf.to_object(cfg.algorithm),
        max_completion_length=cfg.generation.max_completion_length,
    )
