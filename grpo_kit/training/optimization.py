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

    def train_on(
        self, micro_batch: MicroBatch, reduction: Reduction, finite: bool, ends_step: bool
    ) -> tuple[ObjectiveOutput, bool, float | None]:
        """The micro-batch's loss and metrics; whether every loss of the step so far was finite on every process
        (else the step is skipped); the gradient norm when this micro-batch ended the step."""
        accelerator, grad_norm = self.accelerator, None
        parts = self.budget.parts(micro_batch)
        outputs = []
        for index, part in enumerate(parts):
            last = index == len(parts) - 1
            # Processes exchange gradients once, after the last micro-batch of a step.
            with contextlib.nullcontext() if ends_step and last else accelerator.no_sync(self.model):
                out = self.policy_loss(self.model, part, reduction)
                finite = finite and bool(torch.isfinite(out.loss.detach()))
                if last:
                    # Decided by every process together: one that skipped its backward alone would desync DDP.
                    finite = bool(accelerator.gather(torch.tensor([finite], device=accelerator.device)).all())
                if finite:
                    accelerator.sync_gradients = ends_step and last  # DeepSpeed's backward steps its optimizer then
                    accelerator.backward(out.loss)
            outputs.append(out)
        out = outputs[0] if len(outputs) == 1 else together(outputs, micro_batch.width)
        entropy_control = self.policy_loss.objective.entropy_control
        entropy_control.add(out)
        if ends_step:
            self.learning_rate = self.scheduler.get_last_lr()[0]  # before the scheduler moves on to the next step's
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
