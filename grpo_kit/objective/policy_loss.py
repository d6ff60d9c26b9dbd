"""One micro-batch's forward pass and objective: the policy's per-token log-probs, then the loss on them.

This is the seam where a memory-saving path replaces the plain one, which materialises the (B, T, V) logits
(`model.logits`, docs/training.md):
- full: the model's logits, as TRL computes them without Liger;
- chunked: the log-probs and entropies from the last hidden states, `model.logits_chunk_size` positions at a time,
  recomputed in the backward pass; any loss plugin, every objective feature;
- tiled: the same, a tile of `model.logits_chunk_size` positions x `model.logits_vocab_tile` vocabulary columns at a
  time, in the head's precision with a float32 running log-sum-exp (TRL's fused head tiles so); the chunked path
  where the head is not a plain linear layer;
- liger: liger-kernel's fused linear GRPO loss for the losses that declare a Liger equivalent and the settings in
  which it equals the plain objective; the chunked path for everything else. (TRL 1.16 has no such loss: its
  `use_liger_kernel` patches the model's layer kernels, docs/trl.md.)
Old and reference log-probs (no gradient) take the chunked path whenever `model.logits` is not full.
On every path, a mixture-of-experts model's load-balancing loss is added to the training pass's loss
(`algorithm.router_aux_loss_coef`).
"""

import logging
from collections.abc import Callable

import torch

from grpo_kit.contract.errors import ConfigError
from grpo_kit.contract.kinds import Reduction
from grpo_kit.contract.micro_batch import MicroBatch
from grpo_kit.model.fast.chunked_logits import chunked_logps_and_entropies
from grpo_kit.model.fast.tiled_logits import tiled_logps_and_entropies, why_not_tiled
from grpo_kit.model.logprobs import (
    OutputHead,
    RouterLoads,
    last_hidden_states,
    per_token_logps_and_entropies,
    unwrapped,
)
from grpo_kit.objective.objective import Objective, ObjectiveInputs, ObjectiveOutput
from grpo_kit.objective.shadows import Shadows

log = logging.getLogger(__name__)

LOGITS = ("full", "chunked", "tiled", "liger")


class PolicyLoss:
    """`policy_loss(model, micro_batch, reduction)` -> the micro-batch's loss and metrics."""

    def __init__(
        self,
        objective: Objective,
        temperature: float,
        entropy_grad: bool,
        logits: str = "full",
        chunk_size: int = 1024,
        head_in_float32: bool = False,
        vocab_tile: int = 32768,
        shadows: Shadows | None = None,
    ):
        if logits not in LOGITS:
            raise ConfigError(f"model.logits={logits!r} is not one of {', '.join(LOGITS)}.")
        if chunk_size < 1:
            raise ConfigError(f"model.logits_chunk_size={chunk_size} must be at least 1.")
        if vocab_tile < 1:
            raise ConfigError(f"model.logits_vocab_tile={vocab_tile} must be at least 1.")
        self.objective, self.temperature, self.entropy_grad = objective, temperature, entropy_grad
        self.logits, self.chunk_size, self.vocab_tile = logits, chunk_size, vocab_tile
        self.fused = None
        self.shadows = shadows  # other losses on the same tensors, logged (docs/instruments.md)
        self.keep_inputs = False  # set by an instrument that takes gradients of the next micro-batch's objective
        self.router_aux_loss_coef = 0.0  # set by `use_router_aux_loss` once the model is known
        self.last_path: str | None = None  # the path the last micro-batch took: full, chunked, tiled or liger
        self._logged: set[str] = set()
        if logits == "liger":
            from grpo_kit.objective.liger import FusedGRPOLoss

            self.fused = FusedGRPOLoss(objective, temperature, head_in_float32)
            if self.fused.reason is not None:
                self._fall_back(self.fused.reason)
                self.fused = None

    def __call__(
        self,
        model: torch.nn.Module,
        micro_batch: MicroBatch,
        reduction: Reduction,  # the divisors of the micro-batch's generation batch
    ) -> ObjectiveOutput:
        self.last_path = "full" if self.logits == "full" else "chunked"
        router = RouterLoads(model) if self.router_aux_loss_coef != 0.0 else None
        if self.logits == "full":
            per_token_logps, entropies = per_token_logps_and_entropies(  # (B, T)
                model, micro_batch, self.temperature, self.entropy_grad, router=router
            )
            out = self._objective(per_token_logps, entropies, micro_batch, reduction)
            return self._with_router_loss(out, router, reduction)
        head = OutputHead(model)
        hidden = last_hidden_states(model, micro_batch, head, router)  # (B, T, H)
        if self.fused is not None:
            reason = self.fused.head_reason(head) or self.fused.batch_reason(micro_batch, reduction)
            if reason is None:
                self.last_path = "liger"
                out = self._fused_loss(hidden, head, micro_batch, reduction)
                return self._with_router_loss(out, router, reduction)
            self._fall_back(reason)
        ids = micro_batch.completion_ids
        reason = why_not_tiled(head) if self.logits == "tiled" else None
        if self.logits == "tiled" and reason is None:
            self.last_path = "tiled"
            per_token_logps, entropies = tiled_logps_and_entropies(
                hidden, head, ids, self.temperature, self.entropy_grad, self.chunk_size, self.vocab_tile
            )
        else:
            if reason is not None:
                self._fall_back(reason)
            per_token_logps, entropies = chunked_logps_and_entropies(
                hidden, head, ids, self.temperature, self.entropy_grad, self.chunk_size
            )
        out = self._objective(per_token_logps, entropies, micro_batch, reduction)
        return self._with_router_loss(out, router, reduction)

    def _objective(self, per_token_logps, entropies, micro_batch, reduction) -> ObjectiveOutput:
        """The objective, and what the instruments ask of the same tensors."""
        out = self.objective(per_token_logps, entropies, micro_batch, reduction)
        if self.shadows is not None or self.keep_inputs:
            inputs = ObjectiveInputs(per_token_logps, entropies, micro_batch, reduction)
            if self.shadows is not None:
                out.metrics |= self.shadows.values(inputs)
            if self.keep_inputs:
                out.inputs = inputs
        return out

    def use_router_aux_loss(self, model, coef: float | None) -> None:
        """Weigh `model`'s load-balancing loss as TRL does: `coef`, or (None) the model config's own
        router_aux_loss_coef; a non-zero `coef` for a model that is not a mixture of experts is refused."""
        text_config = unwrapped(model).config.get_text_config()
        mixture_of_experts = hasattr(text_config, "output_router_logits")  # MoE configs all have the switch
        if coef and not mixture_of_experts:
            raise ConfigError(
                f"algorithm.router_aux_loss_coef={coef} weighs the router load-balancing loss of a mixture-of-experts "
                f"model, but {type(unwrapped(model)).__name__} has no router: leave it null (or 0) for this model."
            )
        if mixture_of_experts:
            self.router_aux_loss_coef = getattr(text_config, "router_aux_loss_coef", 0.0) if coef is None else coef

    def _with_router_loss(
        self, out: ObjectiveOutput, router: RouterLoads | None, reduction: Reduction
    ) -> ObjectiveOutput:
        if router is None:
            return out
        aux_loss = router.loss()
        # Divided as the policy loss is, so that the step's micro-batches add up to the step's aux loss.
        out.loss = out.loss + self.router_aux_loss_coef * aux_loss / reduction.gradient_accumulation_steps
        out.metrics["aux_loss"] = aux_loss.detach()
        return out

    def logps(self, model: Callable, micro_batch: MicroBatch, entropy_grad: bool = False):
        """(B, T) log-probs and entropies of the completion tokens under `model` (the policy or the reference)."""
        chunk_size = None if self.logits == "full" else self.chunk_size
        vocab_tile = self.vocab_tile if self.logits == "tiled" else None
        return per_token_logps_and_entropies(
            model, micro_batch, self.temperature, entropy_grad, chunk_size, vocab_tile=vocab_tile
        )

    def _fused_loss(self, hidden, head, micro_batch, reduction) -> ObjectiveOutput:
        module = head.module
        loss = self.fused(hidden, module.weight, module.bias, micro_batch, reduction, precision=head.precision())
        # The metrics the plain path logs (clip ratios, kl, entropy, the loss's own), from a pass without a gradient.
        with torch.no_grad():
            per_token_logps, entropies = chunked_logps_and_entropies(
                hidden.detach(), head, micro_batch.completion_ids, self.temperature, chunk_size=self.chunk_size
            )
            metrics = self.objective(per_token_logps, entropies, micro_batch, reduction).metrics
            if self.shadows is not None:
                metrics |= self.shadows.values(ObjectiveInputs(per_token_logps, entropies, micro_batch, reduction))
        return ObjectiveOutput(loss, metrics, per_token_logps)

    def _fall_back(self, reason: str) -> None:
        if reason not in self._logged:
            self._logged.add(reason)
            log.warning(
                "model.logits=%s: the chunked path computes this loss instead, because %s.", self.logits, reason
            )


def build_policy_loss(cfg, objective: Objective, shadows: Shadows | None = None) -> PolicyLoss:
    """The policy loss a composed config describes (its model.logits path), for `objective`, with `shadows`."""
    return PolicyLoss(
        objective,
        cfg.generation.temperature,
        entropy_grad=objective.entropy_control.enabled,
        logits=cfg.model.logits,
        chunk_size=cfg.model.logits_chunk_size,
        head_in_float32=cfg.model.cast_lm_head_to_fp32,
        vocab_tile=cfg.model.logits_vocab_tile,
        shadows=shadows,
    )
