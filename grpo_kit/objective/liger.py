"""liger-kernel's fused linear GRPO loss (`model.logits=liger`): the loss from the last hidden states and the LM head's
weight, with no (B, T, V) logits, for the losses that declare a Liger equivalent.

liger-kernel is optional (`pip install 'grpo-kit[liger]'`) and imported only by a run that asks for it. A loss plugin
says which of Liger's losses it is through `liger_loss()` (grpo_kit.contract.kinds.LigerLoss); this module knows
Liger's API, never a plugin's name. Liger computes the per-token loss, the rollout-correction ratio and the KL term
in the objective's order; it has no entropies, so the objective's entropy features need the chunked path. Before it is
trusted with a setting (which tensors the batch has, and how the loss is divided), it is checked once, on a tiny
random problem, against the plain objective: loss and gradients must agree, or the run uses the chunked path and
says why.
"""

import dataclasses
import importlib.util
from contextlib import nullcontext

import torch

from grpo_kit.contract.kinds import LigerLoss, Reduction, declared
from grpo_kit.contract.micro_batch import MicroBatch
from grpo_kit.objective.objective import Objective

INSTALL = "pip install 'grpo-kit[liger]' (or liger-kernel)"
LEVELS = ("token", "sequence")  # the importance-sampling levels Liger forms: log-ratio, masked mean of the log-ratio


def check_liger_installed() -> None:
    if importlib.util.find_spec("liger_kernel") is None:
        raise ModuleNotFoundError(f"model.logits=liger needs liger-kernel, which is not installed: {INSTALL}.")


def liger_loss_of(loss) -> LigerLoss | None:
    """What the loss plugin declares (None for a plugin without `liger_loss`)."""
    return declared(loss, "loss", "liger_loss")()


def objective_reason(objective: Objective) -> str | None:
    """Why Liger cannot compute this objective in any batch, or None."""
    loss_name = type(objective.loss).__name__
    if liger_loss_of(objective.loss) is None:
        return f"the loss ({loss_name}) declares no Liger equivalent (no liger_loss())"
    algo = objective.algorithm
    if algo.top_entropy_quantile < 1.0:
        return "algorithm.top_entropy_quantile < 1 masks tokens by entropy, which Liger does not compute"
    if objective.entropy_control.enabled:
        return (
            "an entropy bonus (algorithm.entropy_coef != 0 or use_adaptive_entropy) needs the entropies' gradient, "
            "which Liger does not compute"
        )
    if algo.off_policy_mask_threshold is not None:
        return "algorithm.off_policy_mask_threshold (DeepSeek-V3.2's off-policy mask) is not in Liger's loss"
    if objective.importance_sampling.level not in LEVELS:
        return f"importance-sampling level {objective.importance_sampling.level!r} is not one of Liger's {LEVELS}"
    return None


def liger_num_items_in_batch(reduction: Reduction) -> float:
    """What Liger must be given so that its token normaliser (num_items_in_batch / its world size) is
    `reduction.tokens_per_step`, what grpo_kit.contract.reductions.global_token_mean divides by."""
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    return reduction.tokens_per_step * (torch.distributed.get_world_size() if distributed else 1)


class FusedGRPOLoss:
    """One objective's loss through `liger_kernel.chunked_loss.LigerFusedLinearGRPOLoss`."""

    def __init__(self, objective: Objective, temperature: float, head_in_float32: bool = False):
        check_liger_installed()
        from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss

        self.objective, self.temperature, self.head_in_float32 = objective, temperature, head_in_float32
        self.spec = liger_loss_of(objective.loss)
        self.reason = objective_reason(objective)  # None: Liger may compute it, batch settings permitting
        self.checked: dict[tuple, str | None] = {}  # batch setting -> why Liger disagrees there, or None
        if self.reason is None:
            algo = objective.algorithm
            options = dict(
                beta=algo.beta,
                use_ref_model=algo.beta != 0.0,
                use_bias_correction_kl=algo.use_bias_correction_kl,
                loss_type=self.spec.loss_type,
                importance_sampling_level=objective.importance_sampling.level,
                max_completion_length=objective.max_completion_length,
                temperature=temperature,
                chunk_size=1,  # sequences per chunk; Liger chunks each one's positions and vocabulary itself
                compiled=False,  # set per call: torch.compile where the tensors are on a GPU
            )
            try:
                self.module = LigerFusedLinearGRPOLoss(**options, **self.spec.options)
            except (TypeError, ValueError) as error:  # options this liger-kernel does not take, or refuses
                self.reason = f"liger-kernel refused the {self.spec.loss_type!r} loss's options: {error}"

    def head_reason(self, head) -> str | None:
        """Why Liger, which multiplies by the head's weight itself, cannot stand in for this head (an OutputHead)."""
        module = head.module
        if type(module) is not torch.nn.Linear:
            return f"the LM head is a {type(module).__name__}, not a plain torch.nn.Linear (adapters on the head?)"
        if "forward" in vars(module) and not self.head_in_float32:
            return "the LM head's forward has been replaced, and Liger would compute a plain linear layer instead"
        if head.softcap:
            return "the model soft-caps its logits (final_logit_softcapping), which Liger does not"
        return None

    def batch_reason(self, micro_batch: MicroBatch, reduction: Reduction) -> str | None:
        """Why Liger's loss or gradient differs from the plain objective's in this micro-batch's setting, or None.

        The setting is which optional tensors the batch has, the correction ratio's shape and the reduction's
        divisors but the token count, which changes with every generation batch; it is checked once, on a tiny
        random problem with padding, and remembered.
        """
        ratio = micro_batch.importance_sampling_ratio
        setting = (
            micro_batch.old_per_token_logps is not None,
            micro_batch.ref_per_token_logps is not None,
            None if ratio is None else ratio.shape[-1] == 1,
            dataclasses.replace(reduction, num_items_in_batch=0.0),
        )
        if setting not in self.checked:
            device_type = micro_batch.completion_mask.device.type
            with torch.autocast(device_type, enabled=False):  # the comparison is in float32
                self.checked[setting] = self._compare_on_a_probe(micro_batch, reduction)
        return self.checked[setting]

    def __call__(self, hidden, weight, bias, micro_batch, reduction: Reduction, precision=None) -> torch.Tensor:
        """The micro-batch's loss (scaled as the plugin's `reduce` scales it), from (B, T, H) hidden states and the
        head's weight and bias; `precision` is the autocast the model ran its head under."""
        mask = micro_batch.loss_mask().float()
        ratio = micro_batch.importance_sampling_ratio
        if ratio is not None and ratio.shape == mask.shape:
            ratio = torch.where(mask.bool(), ratio, torch.ones_like(ratio))  # padding carries no correction
        self.module.compiled = hidden.is_cuda
        precision = precision or nullcontext()
        if self.head_in_float32:  # model.cast_lm_head_to_fp32: the head's product in float32, autocast or not
            precision, hidden = torch.autocast(hidden.device.type, enabled=False), hidden.float()
        with precision:
            loss, _ = self.module(
                hidden,
                weight,
                micro_batch.completion_ids,
                mask,
                micro_batch.advantages,
                bias=bias,
                ref_per_token_logps=micro_batch.ref_per_token_logps,
                old_per_token_logps=micro_batch.old_per_token_logps,
                vllm_is_ratio=ratio,
                num_items_in_batch=liger_num_items_in_batch(reduction),
            )
        if self.spec.per_micro_batch and reduction.rows_per_micro_batch is not None:  # Liger's mean is over B rows
            loss = loss * len(mask) / (reduction.rows_per_micro_batch * reduction.gradient_accumulation_steps)
        elif self.spec.per_micro_batch:
            loss = loss / reduction.gradient_accumulation_steps
        return loss

    def _compare_on_a_probe(self, micro_batch, reduction) -> str | None:
        generator = torch.Generator().manual_seed(0)
        batch_size, length = micro_batch.completion_mask.shape
        batch_size, length, width, vocab = max(batch_size, 3), max(length, 4), 8, 11
        device = micro_batch.completion_mask.device

        def random(*shape):
            return torch.randn(*shape, generator=generator).to(device)

        lengths = torch.randint(1, length + 1, (batch_size,), generator=generator)
        lengths[0] = length - 1  # at least one padded completion: losses differ in how they treat padding
        mask = (torch.arange(length) < lengths.unsqueeze(1)).long().to(device)
        hidden = random(batch_size, length, width).requires_grad_()
        # Every draw is from the seeded CPU generator, then moved: the probe is the same on any device (a CUDA
        # tensor refuses a CPU generator), and the run's global random stream is left as it was.
        head = torch.nn.utils.skip_init(torch.nn.Linear, width, vocab, bias=False, device=device)
        with torch.no_grad():
            head.weight.copy_(random(vocab, width))
        no_prompt = torch.zeros(batch_size, 0, dtype=torch.long, device=device)  # the objective reads no prompt
        probe = MicroBatch(
            prompt_ids=no_prompt,
            prompt_mask=no_prompt,
            completion_ids=torch.randint(vocab, (batch_size, length), generator=generator).to(device),
            completion_mask=mask,
            advantages=random(batch_size),
        )
        # The probe is a third of its generation batch: a loss divided by this micro-batch's own tokens is caught.
        probe_reduction = dataclasses.replace(reduction, num_items_in_batch=float(mask.sum()) * 3)
        with torch.no_grad():
            logps, _ = self._plain_logps(head, hidden, probe.completion_ids)
        references = {
            name: logps + 0.3 * random(batch_size, length)
            for name in ("old_per_token_logps", "ref_per_token_logps")
            if getattr(micro_batch, name) is not None
        }
        ratio = micro_batch.importance_sampling_ratio
        if ratio is not None:
            shape = (batch_size, 1) if ratio.shape[-1] == 1 else (batch_size, length)
            references["importance_sampling_ratio"] = torch.rand(shape, generator=generator).to(device) * 1.5 + 0.5
        probe = probe.with_references(**references)

        inputs = [hidden, head.weight]
        plain = self.objective(*self._plain_logps(head, hidden, probe.completion_ids), probe, probe_reduction)
        plain_grads = torch.autograd.grad(plain.loss, inputs)
        try:
            fused = self(hidden, head.weight, None, probe, probe_reduction)
            fused_grads = torch.autograd.grad(fused, inputs)
        except Exception as error:  # a plugin's options Liger does not take, a level it refuses, ...
            return f"liger-kernel refused the {self.spec.loss_type!r} loss here: {error}"
        for what, ours, liger in [
            ("loss", plain.loss, fused),
            *zip(("hidden-state gradient", "head gradient"), plain_grads, fused_grads),
        ]:
            scale = ours.abs().max().item()
            if not (ours - liger).abs().max().item() <= 1e-4 * scale + 1e-6:
                return (
                    f"Liger's {self.spec.loss_type!r} loss gives another {what} than the plain objective in this "
                    f"setting ({self._describe(micro_batch)})"
                )
        return None

    def _plain_logps(self, head, hidden, ids):  # (B, T), (B, T): as the plain path computes them, from all logits
        log_probs = (head(hidden).float() / self.temperature).log_softmax(dim=-1)
        entropies = -(log_probs.exp() * log_probs).sum(dim=-1).detach()
        return log_probs.gather(-1, ids.unsqueeze(-1)).squeeze(-1), entropies

    def _describe(self, micro_batch) -> str:
        ratio = micro_batch.importance_sampling_ratio
        parts = [f"{self.objective.importance_sampling.level}-level importance sampling"]
        parts.append("beta > 0" if micro_batch.ref_per_token_logps is not None else "beta = 0")
        if ratio is not None:
            parts.append(f"a {'sequence' if ratio.shape[-1] == 1 else 'token'}-level rollout correction")
        return ", ".join(parts)
