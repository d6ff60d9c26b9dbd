"""The policy's update: the loss and its gradient on each micro-batch, the optimizer step once a step's are in."""

import contextlib
import math
from dataclasses import dataclass
from typing import Any

import torch
from accelerate import Accelerator

from grpo_kit.contract.kinds import Reduction
from grpo_kit.contract.micro_batch import MicroBatch
from grpo_kit.objective.objective import ObjectiveOutput
from grpo_kit.objective.policy_loss import PolicyLoss
from grpo_kit.training.batches import GenerationBatch
from grpo_kit.training.instruments import Instruments
from grpo_kit.training.token_budget import TokenBudget, joined


@dataclass
class Optimization:
    """The accumulation is counted here, not by accelerate: the loss plugins already divide by the accumulation
    steps, as TRL's losses do, and accelerate's own accumulation would divide the loss once more."""

    model: torch.nn.Module  # prepared by the accelerator
    optimizer: torch.optim.Optimizer
    scheduler: Any
    accelerator: Accelerator
    policy_loss: PolicyLoss
    max_grad_norm: float
    learning_rate: float = math.nan  # the rate the last optimizer step used, which is logged (as TRL logs it)
    budget: TokenBudget = TokenBudget(None, False)  # a micro-step's micro-batches (trainer.max_tokens_per_micro_batch)
    instruments: Instruments | None = None  # shadow gradients, gradient diagnostics (docs/instruments.md)
    micro_steps: int = 0  # of the step under way, so far

    def train_on(
        self,
        micro_batch: MicroBatch,
        reduction: Reduction,
        finite: bool,
        ends_step: bool,
        step: int = 0,  # the optimizer step it belongs to, counted from 1: when the instruments are due
        batch: GenerationBatch | None = None,  # its generation batch, which the instruments' length quartiles span
    ) -> tuple[ObjectiveOutput, bool, float | None]:
        """The micro-batch's loss and metrics; whether every loss of the step so far was finite on every process
        (else the step is skipped); the gradient norm when this micro-batch ended the step."""
        accelerator, grad_norm, instruments = self.accelerator, None, self.instruments
        parts = self.budget.parts(micro_batch)
        outputs = []
        for index, part in enumerate(parts):
            last = index == len(parts) - 1
            first = self.micro_steps == 0 and index == 0  # `.grad` then holds this micro-batch's gradient alone
            keep = instruments is not None and instruments.needs_graph(
                step, reduction.gradient_accumulation_steps, first
            )
            self.policy_loss.keep_inputs = keep
            # Processes exchange gradients once, after the last micro-batch of a step.
            with contextlib.nullcontext() if ends_step and last else accelerator.no_sync(self.model):
                out = self.policy_loss(self.model, part, reduction)
                finite = finite and bool(torch.isfinite(out.loss.detach()))
                if last:
                    # Decided by every process together: one that skipped its backward alone would desync DDP.
                    finite = bool(accelerator.gather(torch.tensor([finite], device=accelerator.device)).all())
                if finite:
                    accelerator.sync_gradients = ends_step and last  # DeepSpeed's backward steps its optimizer then
                    accelerator.backward(out.loss, **({"retain_graph": True} if keep else {}))
                    if keep:
                        out.metrics |= instruments.after_backward(out, step, first, batch.micro_batches)
            out.inputs = None
            outputs.append(out)
        out = outputs[0] if len(outputs) == 1 else together(outputs, micro_batch.width)
        entropy_control = self.policy_loss.objective.entropy_control
        entropy_control.add(out)
        diagnostics = instruments.diagnostics if instruments is not None else None
        if diagnostics is not None and finite:
            diagnostics.after_micro_step(len(micro_batch))
        self.micro_steps = 0 if ends_step else self.micro_steps + 1
        if ends_step:
            self.learning_rate = self.scheduler.get_last_lr()[0]  # before the scheduler moves on to the next step's
            if diagnostics is not None:  # a skipped step has no gradient to diagnose
                out.metrics |= diagnostics.end_step() if finite else diagnostics.discard()
            if finite:
                grad_norm = float(accelerator.clip_grad_norm_(self.model.parameters(), self.max_grad_norm))
                self.optimizer.step()
                self.scheduler.step()
            self.optimizer.zero_grad()
            out.metrics |= entropy_control.end_step(accelerator)
        return out, finite, grad_norm


def together(outputs: list[ObjectiveOutput], width: int) -> ObjectiveOutput:
    """A micro-step's outputs as one: its micro-batches' losses added up (a step's micro-step losses add up to its
    loss), their metrics averaged, their log-probs in the micro-step's (B, width) layout."""
    totals = [out.entropy_totals for out in outputs if out.entropy_totals is not None]
    return ObjectiveOutput(
        torch.stack([out.loss.detach() for out in outputs]).sum(),
        {name: torch.stack([out.metrics[name] for out in outputs]).nanmean() for name in outputs[0].metrics},
        joined([out.per_token_logps for out in outputs], width),
        torch.stack(totals).sum(dim=0) if totals else None,
    )
