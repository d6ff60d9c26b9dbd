"""The instruments' part of an optimizer step (docs/instruments.md): shadow gradients compared with the trained
one, and the gradient diagnostics. Neither changes what is trained: their gradients are taken with
`torch.autograd.grad`, which leaves `.grad` alone, from the graph the trained backward pass kept for them."""

from dataclasses import dataclass

import torch
from omegaconf import OmegaConf

from grpo_kit.contract.distributed import weights_are_sharded
from grpo_kit.contract.errors import ConfigError
from grpo_kit.contract.micro_batch import MicroBatch
from grpo_kit.objective.objective import Objective, ObjectiveOutput
from grpo_kit.objective.shadows import Shadows
from grpo_kit.training.diagnostics import GradientDiagnostics
from grpo_kit.training.gradients import Trainable, compared, parameter_group


@dataclass
class Instruments:
    objective: Objective  # the trained one
    shadows: Shadows | None
    diagnostics: GradientDiagnostics | None
    trainable: Trainable

    def needs_graph(self, step: int, accumulation: int, starts_step: bool) -> bool:
        """Whether this micro-batch's objective must keep its graph past the trained backward pass."""
        shadow = self.shadows is not None and self.shadows.gradients_due(step) and starts_step
        return shadow or (self.diagnostics is not None and self.diagnostics.needs_graph(step, accumulation))

    def after_backward(
        self, out: ObjectiveOutput, step: int, starts_step: bool, batch: list[MicroBatch]
    ) -> dict[str, torch.Tensor]:
        """After the trained backward pass of a micro-batch that kept its graph; `starts_step`: it is the step's
        first, so that `.grad` holds its gradient alone; `batch`: its generation batch's micro-batches."""
        inputs, out.inputs = out.inputs, None  # the graph goes once this returns
        metrics = {}
        if self.shadows is not None and self.shadows.gradients_due(step) and starts_step:
            trained = self.trainable.accumulated()
            groups = [parameter_group(name) for name in self.trainable.names]
            for name, loss in self.shadows.losses(inputs):
                shadow = self.trainable.gradient(loss)
                metrics |= {f"shadow/{name}/{key}": value for key, value in compared(shadow, trained, groups).items()}
        if self.diagnostics is not None:
            lengths = torch.cat([rows.completion_mask.sum(dim=1) for rows in batch])  # (N,)
            self.diagnostics.after_backward(inputs, self.objective, step, lengths)
        device = self.trainable.params[0].device
        return {name: torch.tensor(value, device=device) for name, value in metrics.items()}


def build_instruments(
    objective: Objective, shadows: Shadows | None, diagnostics_config, correct_threshold: float, model, accelerator
) -> Instruments | None:
    """The instruments a run selected (None: none), for the prepared `model`."""
    gradients = diagnostics_config is not None or (shadows is not None and shadows.gradient_every > 0)
    if shadows is None and diagnostics_config is None:
        return None
    if gradients and (accelerator.num_processes > 1 or weights_are_sharded(accelerator)):
        raise ConfigError(
            "shadow gradients (shadow.gradient_every) and +diagnostics=gradient read whole gradients on one process; "
            f"this run has {accelerator.num_processes} process(es), its weights sharded: "
            f"{weights_are_sharded(accelerator)}. Run them on one unsharded process, or set shadow.gradient_every=0 "
            "and drop +diagnostics=gradient (the shadow losses themselves work on any number)."
        )
    trainable = Trainable.of(model)
    diagnostics = None
    if diagnostics_config is not None:
        diagnostics = GradientDiagnostics(OmegaConf.to_object(diagnostics_config), trainable, correct_threshold)
    return Instruments(objective, shadows, diagnostics, trainable)
