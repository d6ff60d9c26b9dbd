"""Shadow objectives (`+shadow=[cispo,grpo]`, docs/instruments.md): other losses computed on the very tensors the
run trains on (log-probs, old and reference log-probs, advantages, masks, divisors), logged and never trained.

A shadow is the run's objective with another loss plugin in it: the same importance-sampling level, rollout
correction, masks, KL term and entropy bonus (the trained objective's coefficient), so that what differs between
`loss` and `shadow/NAME/loss` is the loss alone.
"""

from dataclasses import dataclass, replace

import torch
from omegaconf import DictConfig

from grpo_kit.config.compose import options
from grpo_kit.config.schema import SHADOW_GRADIENT_EVERY
from grpo_kit.objective.objective import Objective, ObjectiveInputs
from grpo_kit.plugins.registry import Registry

# The trained objective logs these itself; a shadow's would be the same numbers.
SHARED_METRICS = {"entropy", "kl", "entropy_coef"}


@dataclass
class Shadows:
    objectives: dict[str, Objective]  # name -> the run's objective with that loss
    gradient_every: int  # optimizer steps between gradient comparisons; 0: never

    def gradients_due(self, step: int) -> bool:
        return self.gradient_every > 0 and step % self.gradient_every == 0

    @torch.no_grad()
    def values(self, inputs: ObjectiveInputs) -> dict[str, torch.Tensor]:
        """`shadow/NAME/loss` on a step's scale (as the logged `loss`) and every other metric each loss reports."""
        logps, entropies = inputs.per_token_logps.detach(), inputs.entropies.detach()
        accumulation = inputs.reduction.gradient_accumulation_steps
        metrics = {}
        for name, objective in self.objectives.items():
            out = objective(logps, entropies, inputs.micro_batch, inputs.reduction)
            metrics[f"shadow/{name}/loss"] = out.loss * accumulation
            for metric, value in out.metrics.items():
                if metric not in SHARED_METRICS:
                    metrics[f"shadow/{name}/{metric}"] = value
        return metrics

    def losses(self, inputs: ObjectiveInputs):
        """(name, loss) for each shadow, with its graph: for its gradient."""
        for name, objective in self.objectives.items():
            yield name, objective(inputs.per_token_logps, inputs.entropies, inputs.micro_batch, inputs.reduction).loss


def build_shadows(cfg: DictConfig, registry: Registry, trained: Objective) -> Shadows | None:
    """The shadows `cfg.shadow` selects, each sharing `trained`'s entropy control; None when it selects none."""
    chosen = {name: node for name, node in cfg.shadow.items() if name != SHADOW_GRADIENT_EVERY}
    if not chosen:
        return None
    objectives = {}
    for name, node in chosen.items():
        loss = registry.build("loss", node.name, options(node))
        shadow = replace(trained, loss=loss)  # a new Objective; its own entropy control is replaced next
        shadow.entropy_control = trained.entropy_control  # the coefficient the trained loss's step applies
        objectives[name] = shadow
    return Shadows(objectives, int(cfg.shadow[SHADOW_GRADIENT_EVERY]))
