"""Gradient diagnostics (`+diagnostics=gradient`, docs/instruments.md), from the gradients the accumulation computes.

Every optimizer step: the gradient noise scale and signal-to-noise ratio, from the sketches of the step's micro-step
gradients and of their sum (a step of one micro-batch is split into two random halves, one extra backward pass).
Every `groups_every` steps: the gradient contributed by each group of completions (length quartile over the
generation batch, advantage sign, correct or not), one extra backward pass per group and micro-batch; the groups of
each split add up to the step's gradient. Gradients are held as count sketches (gradients.py), never copied.
"""

from dataclasses import dataclass, field

import torch

from grpo_kit.config.schema import GradientDiagnosticsConfig
from grpo_kit.objective.objective import Objective, ObjectiveInputs
from grpo_kit.training.gradients import CountSketch, NoiseScale, Trainable, split_gradients


@dataclass
class GradientDiagnostics:
    config: GradientDiagnosticsConfig
    trainable: Trainable
    correct_threshold: float  # eval.correct_threshold: a completion whose reward reaches it is correct
    sketch: CountSketch = field(init=False)
    noise: NoiseScale = field(init=False)
    cumulative: list[torch.Tensor] = field(default_factory=list)  # the step's sketch after each micro-step
    half: torch.Tensor | None = None  # a step of one micro-step: the sketch of one half of its rows
    groups: dict[str, torch.Tensor] = field(default_factory=dict)  # the step's sketch per group of completions
    rows: dict[str, int] = field(default_factory=dict)  # the step's completions per group
    completions: int = 0  # the step's completions so far

    def __post_init__(self):
        self.sketch = CountSketch(self.config.sketch_size, self.config.seed)
        self.noise = NoiseScale(self.config.ema)

    def groups_due(self, step: int) -> bool:
        return self.config.groups_every > 0 and step % self.config.groups_every == 0

    def needs_graph(self, step: int, accumulation: int) -> bool:
        """Whether the objective's graph must outlive the backward pass: for the halves or the groups."""
        return accumulation == 1 or self.groups_due(step)

    def after_backward(self, inputs: ObjectiveInputs, objective: Objective, step: int, lengths) -> None:
        """After the backward pass of a micro-batch whose objective's graph was kept (`needs_graph`): the gradient of
        one half of its rows, or of each group. `lengths`: (N,) the completion lengths of its generation batch."""
        micro_batch = inputs.micro_batch

        def loss_of(row_weights: torch.Tensor) -> torch.Tensor:
            return objective(inputs.per_token_logps, inputs.entropies, micro_batch, inputs.reduction, row_weights).loss

        if inputs.reduction.gradient_accumulation_steps == 1:
            ((_, grads),) = split_gradients(loss_of, self.trainable, {"half": self._half(len(micro_batch), step)})
            self.half = self.sketch(grads) + (0 if self.half is None else self.half)
        if self.groups_due(step):
            split = completion_groups(micro_batch, lengths, self.correct_threshold)
            for name, grads in split_gradients(loss_of, self.trainable, split):
                self.groups[name] = self.sketch(grads) + self.groups.get(name, 0)
                self.rows[name] = self.rows.get(name, 0) + int(split[name].sum())

    def after_micro_step(self, rows: int) -> None:
        """A micro-step's micro-batches are in: the sketch of the gradient accumulated so far."""
        self.cumulative.append(self.sketch(self.trainable.accumulated()))
        self.completions += rows

    def end_step(self) -> dict[str, torch.Tensor]:
        """Before the optimizer step (and its clipping): the step's metrics."""
        total, completions = self.cumulative[-1], self.completions
        if len(self.cumulative) == 1:
            shares = [self.half, total - self.half]  # two halves of the one micro-batch
        else:
            shares = [now - before for now, before in zip(self.cumulative, [0, *self.cumulative[:-1]])]
        n = len(shares)
        small_sq = [float((n * share).square().sum()) for share in shares]  # n x a share: the mean over its rows
        metrics = self.noise.update(small_sq, completions / n, float(total.square().sum()), completions)
        if self.groups:
            whole = float(total.norm())
            for name, sketch in self.groups.items():
                norm = float(sketch.norm())
                metrics[f"grad/group/{name}/norm"] = norm
                metrics[f"grad/group/{name}/share"] = norm / whole if whole else float("nan")
                metrics[f"grad/group/{name}/rows"] = self.rows[name] / completions
        self.discard()
        device = total.device
        return {name: torch.tensor(value, device=device) for name, value in metrics.items()}

    def discard(self) -> dict:
        """Forget the step's sketches (a skipped step's, or a logged one's)."""
        self.cumulative, self.half, self.groups, self.rows, self.completions = [], None, {}, {}, 0
        return {}

    def _half(self, rows: int, step: int) -> torch.Tensor:  # (B,) bool
        generator = torch.Generator().manual_seed(self.config.seed * 1_000_003 + step)
        picked = torch.randperm(rows, generator=generator)[: rows // 2]
        half = torch.zeros(rows, dtype=torch.bool)
        half[picked] = True
        return half.to(self.trainable.params[0].device)


def completion_groups(micro_batch, lengths: torch.Tensor, correct_threshold: float) -> dict[str, torch.Tensor]:
    """(B,) boolean rows of each group: by length quartile over the generation batch's `lengths`, by the sign of the
    advantage, by whether the reward reaches `correct_threshold` (no reward: not correct, as in evaluation). Each
    split covers every row once."""
    own = micro_batch.completion_mask.sum(dim=1)  # (B,)
    edges = torch.quantile(lengths.float(), torch.tensor([0.25, 0.5, 0.75], device=lengths.device))
    quartile = torch.bucketize(own.float(), edges.to(own.device))  # (B,) 0..3
    advantages = micro_batch.advantages
    groups = {f"length_q{q + 1}": quartile == q for q in range(4)}
    groups |= {
        "advantage_positive": advantages > 0,
        "advantage_negative": advantages < 0,
        "advantage_zero": advantages == 0,
    }
    if micro_batch.rewards is not None:
        correct = micro_batch.rewards >= correct_threshold  # NaN is never correct
        groups |= {"correct": correct, "incorrect": ~correct}
    return groups
