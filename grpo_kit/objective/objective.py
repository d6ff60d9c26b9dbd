"""The objective on one micro-batch, tensors only: importance weights -> loss -> masks / correction / KL -> reduction.

The loss, the importance-sampling level and the rollout correction are plugins; this file is the order in
which they are applied, which is the order of TRL's GRPOTrainer.
"""

import math
from dataclasses import dataclass, field

import torch
from omegaconf import OmegaConf

from grpo_kit.config.compose import options
from grpo_kit.config.schema import AlgorithmConfig
from grpo_kit.contract.kinds import ImportanceSampling, Loss, LossInputs, Reduction, declared
from grpo_kit.contract.micro_batch import MicroBatch
from grpo_kit.contract.reductions import masked_mean
from grpo_kit.plugins.registry import Registry


@dataclass
class ObjectiveInputs:
    """What an objective is computed from, the log-probs with their graph: kept for the instruments
    (docs/instruments.md), which compute other objectives from the same tensors and take their gradients."""

    per_token_logps: torch.Tensor  # (B, T), with gradient
    entropies: torch.Tensor  # (B, T)
    micro_batch: MicroBatch
    reduction: Reduction


@dataclass
class ObjectiveOutput:
    loss: torch.Tensor  # scalar, already scaled for gradient accumulation
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)  # name -> scalar, detached
    per_token_logps: torch.Tensor | None = None  # (B, T), detached: the log-probs the loss was computed from
    # (2,) detached: the entropy sum and count of the tokens the bonus acts on, for adaptive entropy control
    entropy_totals: torch.Tensor | None = None
    inputs: ObjectiveInputs | None = None  # kept only when an instrument asks (PolicyLoss.keep_inputs)


@dataclass
class EntropyControl:
    """The entropy bonus's coefficient. Fixed at `algorithm.entropy_coef`, or adapted once per optimizer step
    (Skywork-OR1, arXiv 2505.22312, section 3.2.2) from the mean entropy of the step's trained tokens, over every
    process, as TRL 1.16 adapts it."""

    algorithm: AlgorithmConfig
    coef: float = field(init=False)
    last_entropy: float = math.inf  # the last step's; inf before the first, so that no bonus applies yet
    step_totals: torch.Tensor | None = None  # (2,) the entropy sum and count of the step's micro-batches so far

    def __post_init__(self):
        self.coef = self.algorithm.entropy_coef

    @property
    def enabled(self) -> bool:
        """Adaptive control keeps the bonus on at coefficient 0, so that it can come back."""
        return self.coef != 0.0 or self.algorithm.use_adaptive_entropy

    def applied_coef(self) -> float:
        """The coefficient every micro-batch of this step uses: the one the last step's update left."""
        algo = self.algorithm
        if algo.use_adaptive_entropy and not self.last_entropy <= algo.entropy_target:
            return 0.0
        return self.coef

    def add(self, out: "ObjectiveOutput") -> None:
        """A micro-batch's entropies, toward the step's mean."""
        if out.entropy_totals is not None:
            self.step_totals = out.entropy_totals + (0 if self.step_totals is None else self.step_totals)

    def end_step(self, accelerator) -> dict[str, torch.Tensor]:
        """At the optimizer step (skipped steps too, as TRL's): the update from the mean entropy of the step's
        trained tokens on every process; the coefficient to log, as TRL logs it, while the bonus is on."""
        if self.step_totals is not None and self.algorithm.use_adaptive_entropy:
            entropy_sum, count = accelerator.reduce(self.step_totals, reduction="sum").tolist()
            self.update(entropy_sum / max(count, 1.0))
        self.step_totals = None
        return {"entropy_coef": torch.tensor(self.coef, device=accelerator.device)} if self.enabled else {}

    def update(self, step_entropy: float) -> None:
        """At the optimizer step: the coefficient up by entropy_coef_delta while the entropy is at or below the
        target, down otherwise, within [entropy_coef_min, entropy_coef_max]."""
        algo = self.algorithm
        if step_entropy <= algo.entropy_target:
            self.coef = min(self.coef + algo.entropy_coef_delta, algo.entropy_coef_max)
        else:
            self.coef = max(self.coef - algo.entropy_coef_delta, algo.entropy_coef_min)
        self.last_entropy = step_entropy

    def state_dict(self) -> dict:
        return {"coef": self.coef, "last_entropy": self.last_entropy}

    def load_state_dict(self, state: dict) -> None:
        self.coef, self.last_entropy = state["coef"], state["last_entropy"]


@dataclass
class Objective:
    loss: Loss
    importance_sampling: ImportanceSampling
    algorithm: AlgorithmConfig
    max_completion_length: int
    entropy_control: EntropyControl = field(init=False)

    def __post_init__(self):
        self.entropy_control = EntropyControl(self.algorithm)

    def __call__(
        self,
        per_token_logps: torch.Tensor,  # (B, T), log pi_theta of the completion tokens, with gradient
        entropies: torch.Tensor,  # (B, T), with gradient when the entropy bonus is on
        batch: MicroBatch,
        reduction: Reduction | None = None,  # the generation batch's divisors; None: the batch is the whole of it
        row_weights: torch.Tensor | None = None,  # (B,) each row's share of the loss: the instruments' group split
    ) -> ObjectiveOutput:
        algo = self.algorithm
        mask = batch.loss_mask().to(per_token_logps.dtype)  # (B, T)
        if reduction is None:
            reduction = Reduction.whole_batch(mask, self.max_completion_length)
        advantages = batch.advantages.unsqueeze(1)  # (B, 1)
        old_per_token_logps = batch.old_per_token_logps
        if old_per_token_logps is None:  # on-policy: pi_old is pi_theta, without its gradient
            old_per_token_logps = per_token_logps.detach()
        rollout_ratio = batch.importance_sampling_ratio  # (B, T) or (B, 1), handed over (sampler_correction.py)

        log_ratio = per_token_logps - old_per_token_logps  # (B, T)
        log_weights = self.importance_sampling.log_weights(log_ratio, mask)  # (B, T) or (B, 1)
        inputs = LossInputs(log_weights, log_ratio, advantages, per_token_logps, mask, rollout_ratio)
        per_token_loss, metrics = self.loss.per_token_loss(inputs)

        # DeepSeek-V3.2 (arXiv 2512.02556, eq. 9): drop negative-advantage sequences the sampler has drifted from.
        if algo.off_policy_mask_threshold is not None:
            sampling_per_token_logps = batch.sampling_per_token_logps
            if sampling_per_token_logps is None:
                sampling_per_token_logps = old_per_token_logps
            per_token_loss = per_token_loss * off_policy_mask(
                advantages, per_token_logps, sampling_per_token_logps, mask, algo.off_policy_mask_threshold
            )
        # "Beyond the 80/20 Rule" (arXiv 2506.01939): only the high-entropy "forking" tokens get a gradient.
        entropy_mask = None
        if algo.top_entropy_quantile < 1.0:
            entropy_mask = high_entropy_mask(entropies.detach(), mask, 1 - algo.top_entropy_quantile)
            per_token_loss = per_token_loss * entropy_mask
        if rollout_ratio is not None and not declared(self.loss, "loss", "consumes_rollout_ratio"):
            per_token_loss = per_token_loss * rollout_ratio
        # k3 estimator of KL(pi_theta || pi_ref) (Schulman, http://joschu.net/blog/kl-approx.html), DeepSeekMath eq. 4.
        if algo.beta != 0.0:
            ref_log_ratio = batch.ref_per_token_logps - per_token_logps
            per_token_kl = torch.exp(ref_log_ratio) - ref_log_ratio - 1  # (B, T)
            if algo.use_bias_correction_kl:  # unbiased under the sampling policy (DeepSeek-V3.2, eq. 7)
                per_token_kl = per_token_kl * torch.exp(log_weights)
            per_token_loss = per_token_loss + algo.beta * per_token_kl
            metrics["kl"] = masked_mean(per_token_kl, mask)
        # Every reduction is linear in the per-token loss, its divisors fixed: a group of rows' loss is the loss of
        # the per-token loss zeroed outside it, and the groups of a split add up to the whole.
        if row_weights is not None:
            per_token_loss = per_token_loss * row_weights.unsqueeze(1)

        loss = self.loss.reduce(per_token_loss, mask, reduction)

        entropy_totals = None
        if self.entropy_control.enabled:
            # A bonus on the mean entropy of the tokens that are trained, the same whatever the loss's normaliser.
            accumulation = reduction.gradient_accumulation_steps
            metrics["policy_loss"] = loss * accumulation  # before the bonus, on a step's scale
            trained = mask if entropy_mask is None else mask * entropy_mask
            bonus_tokens = trained if row_weights is None else trained * row_weights.unsqueeze(1)
            entropy_sum, count = (entropies * bonus_tokens).sum(), trained.sum()
            mean_entropy = entropy_sum / count.clamp(min=1.0)
            loss = loss - self.entropy_control.applied_coef() * mean_entropy / accumulation
            entropy_totals = torch.stack([entropy_sum, count.to(entropy_sum.dtype)]).detach()
        metrics["entropy"] = masked_mean(entropies, mask)
        metrics = {name: value.detach() for name, value in metrics.items()}
        return ObjectiveOutput(loss, metrics, per_token_logps.detach(), entropy_totals)


def off_policy_mask(advantages, per_token_logps, sampling_per_token_logps, mask, threshold) -> torch.Tensor:
    """(B, 1): 0 for a sequence with a negative advantage whose mean KL(sampler || policy) exceeds `threshold`."""
    kl = torch.nan_to_num(sampling_per_token_logps - per_token_logps.detach(), nan=0.0)  # unscored tokens: no evidence
    mean_kl = (kl * mask).sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp(min=1.0)
    return ((advantages >= 0) | (mean_kl <= threshold)).to(mask.dtype)


def high_entropy_mask(entropies, mask, quantile: float) -> torch.Tensor:
    """(B, T): the active tokens whose entropy is at least the `quantile` of the active tokens' entropies."""
    active = entropies[mask.bool()].float()
    if active.numel() == 0:
        return torch.zeros_like(mask)
    threshold = torch.quantile(active, quantile)
    return ((entropies * mask >= threshold) & mask.bool()).to(mask.dtype)


def build_objective(cfg, registry: Registry | None = None) -> Objective:
    """The objective a composed config describes (see grpo_kit.compose)."""
    registry = registry or Registry()
    return Objective(
        loss=registry.build("loss", cfg.loss.name, options(cfg.loss)),
        importance_sampling=registry.build(
            "importance_sampling", cfg.importance_sampling.name, options(cfg.importance_sampling)
        ),
        algorithm=OmegaConf.to_object(cfg.algorithm),
        max_completion_length=cfg.generation.max_completion_length,
    )
