"""The rollout correction, from the decision to its metrics: whether this run's samples get one, the ratio each
micro-batch carries, and how far the sampler strays from the trainer.

A sampler other than the trained model (vLLM, a custom rollout) gives log-probs that differ from the trainer's; the
rollout_correction plugin turns the two into an importance ratio (truncated IS, masking; TRL's
`vllm_importance_sampling_*`). This class decides once whether it applies (`compatibility.corrects_rollouts` and
the plugin's level), asks the rollout for the sampler's log-probs through `applies`, computes each micro-batch's
ratio, and logs TRL's `sampling/` metrics over the generation batch. The objective only multiplies by the ratio it
is handed.
"""

import math
from dataclasses import dataclass

import torch

from grpo_kit.config.compatibility import corrects_rollouts
from grpo_kit.config.compose import options
from grpo_kit.contract.kinds import RolloutCorrection
from grpo_kit.contract.micro_batch import MicroBatch
from grpo_kit.plugins.registry import Registry


@dataclass
class SamplerCorrection:
    plugin: RolloutCorrection
    applies: bool  # the run asks its sampler for log-probs and corrects by them

    @classmethod
    def of(cls, cfg, registry: Registry) -> "SamplerCorrection":
        plugin = registry.build("rollout_correction", cfg.rollout_correction.name, options(cfg.rollout_correction))
        return cls(plugin, (corrects_rollouts(cfg, registry) or samples_lagged(cfg)) and plugin.level is not None)

    def ratio(self, micro_batch: MicroBatch) -> torch.Tensor | None:  # (B, T) or (B, 1)
        """The micro-batch's ratio, from its old log-probs and the sampler's; None where the plugin gives none."""
        return self.plugin.ratio(
            micro_batch.old_per_token_logps, micro_batch.sampling_per_token_logps, micro_batch.loss_mask()
        )

    def metrics(self, micro_batches: list[MicroBatch], accelerator) -> dict[str, float]:
        """How far the sampler's log-probs are from the trainer's, and the correction's ratio, over the whole
        generation batch (TRL's `sampling/` metrics)."""
        # Each micro-batch is cut to its own width: its active tokens (or sequences) are flattened before joining.
        differences, ratios = [], []
        for batch in micro_batches:
            mask = batch.loss_mask().bool()  # (B, T)
            ratio = batch.importance_sampling_ratio  # (B, T) or (B, 1)
            ratios.append(ratio[mask] if ratio.shape == mask.shape else ratio.view(-1))  # active tokens, or sequences
            differences.append((batch.old_per_token_logps - batch.sampling_per_token_logps)[mask])
        difference, ratio = torch.cat(differences).abs().float(), torch.cat(ratios).float()
        # Each process's sums, counts and extremes, gathered: processes hold different numbers of tokens.
        local = torch.tensor(
            [
                difference.sum().item(),
                difference.max().item() if difference.numel() else 0.0,
                difference.numel(),
                ratio.sum().item(),
                ratio.min().item() if ratio.numel() else math.inf,
                ratio.max().item() if ratio.numel() else 0.0,
                ratio.numel(),
            ],
            device=accelerator.device,
        )
        every = accelerator.gather(local.unsqueeze(0))  # (processes, 7)
        return {
            "sampling/sampling_logp_difference/mean": (every[:, 0].sum() / every[:, 2].sum().clamp(min=1)).item(),
            "sampling/sampling_logp_difference/max": every[:, 1].max().item(),
            "sampling/importance_sampling_ratio/mean": (every[:, 3].sum() / every[:, 6].sum().clamp(min=1)).item(),
            "sampling/importance_sampling_ratio/min": every[:, 4].min().item(),
            "sampling/importance_sampling_ratio/max": every[:, 5].max().item(),
        }


def samples_lagged(cfg) -> bool:
    """Whether the sampler is an older policy than the trained one by construction (algorithm.forced_staleness >= 1):
    then even a backend that samples with the trained model itself (algorithm.correct_policy_sampler=false) is
    corrected. At 0 the sampler is the policy, and the run is the one without forced staleness."""
    return (cfg.algorithm.forced_staleness or 0) >= 1
