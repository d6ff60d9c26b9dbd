"""The policy's update: the loss and its gradient on each micro-batch, the optimizer step once a step's are in."""

import contextlib
import math
from dataclasses import dataclass
from typing import Any

import torch
from accelerate import Accelerator

from grpo_kit.contract.kinds import Reduction
from grpo_kit.objective.objective import ObjectiveOutput
from grpo_kit.objective.policy_loss import PolicyLoss


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
    entropy_totals: torch.Tensor | None = None  # (2,) the entropy sum and count of the step so far
    learning_rate: float = math.nan  # the rate the last optimizer step used, which is logged (as TRL logs it)

    def train_on(
        self, micro_batch: dict[str, torch.Tensor], reduction: Reduction, finite: bool, ends_step: bool
    ) -> tuple[ObjectiveOutput, bool, float | None]:
        """The micro-batch's loss and metrics; whether every loss of the step so far was finite on every process
        (else the step is skipped); the gradient norm when this micro-batch ended the step."""
        accelerator, grad_norm = self.accelerator, None
        # Processes exchange gradients once, after the last micro-batch of a step.
        with contextlib.nullcontext() if ends_step else accelerator.no_sync(self.model):
            out = self.policy_loss(self.model, micro_batch, reduction)
            # Decided by every process together: one that skipped its backward alone would desync DDP.
            finite = finite and bool(accelerator.gather(torch.isfinite(out.loss.detach()).reshape(1)).all())
            if finite:
                accelerator.sync_gradients = ends_step  # DeepSpeed's backward steps its optimizer when True
                accelerator.backward(out.loss)
        if out.entropy_totals is not None:
            self.entropy_totals = out.entropy_totals + (0 if self.entropy_totals is None else self.entropy_totals)
        if ends_step:
            self.learning_rate = self.scheduler.get_last_lr()[0]  # before the scheduler moves on to the next step's
            if finite:
                grad_norm = float(accelerator.clip_grad_norm_(self.model.parameters(), self.max_grad_norm))
                self.optimizer.step()
                self.scheduler.step()
            self.optimizer.zero_grad()
            self._end_entropy_window(out)
        return out, finite, grad_norm

    @property
    def entropy_control(self):
        return self.policy_loss.objective.entropy_control

    def _end_entropy_window(self, out: ObjectiveOutput) -> None:
        """Adaptive entropy control's update, once per optimizer step as TRL's (skipped steps too), from the mean
        entropy of the step's trained tokens on every process; the coefficient is logged as TRL logs it."""
        control = self.entropy_control
        if self.entropy_totals is not None and self.policy_loss.objective.algorithm.use_adaptive_entropy:
            entropy_sum, count = self.accelerator.reduce(self.entropy_totals, reduction="sum").tolist()
            control.update(entropy_sum / max(count, 1.0))
        self.entropy_totals = None
        if control.enabled:
            out.metrics["entropy_coef"] = torch.tensor(control.coef, device=self.accelerator.device)
