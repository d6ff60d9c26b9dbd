"""Gradients as the instruments read them (docs/instruments.md): parameter groups, a count sketch that keeps a
gradient in a few thousand numbers, two gradients compared, and the gradient noise scale."""

import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

# Each trainable parameter's group, by the first pattern its name matches: the groups the sign agreement of two
# gradients is logged for.
PARAMETER_GROUPS = (
    ("embedding", re.compile(r"embed|wte|wpe")),
    ("head", re.compile(r"lm_head|output_layer")),
    ("norm", re.compile(r"norm|ln_")),
    ("attention", re.compile(r"attn|attention")),
    ("mlp", re.compile(r"mlp|experts|feed_forward|ffn")),
)


def parameter_group(name: str) -> str:
    return next((group for group, pattern in PARAMETER_GROUPS if pattern.search(name)), "other")


@dataclass
class Trainable:
    """The parameters a gradient is taken of, with their groups."""

    names: list[str]
    params: list[torch.nn.Parameter]

    @classmethod
    def of(cls, model: torch.nn.Module) -> "Trainable":
        named = [(name, param) for name, param in model.named_parameters() if param.requires_grad]
        return cls([name for name, _ in named], [param for _, param in named])

    def accumulated(self) -> list[torch.Tensor]:
        """What backward passes have added up in `.grad` so far (zeros where none has yet)."""
        return [torch.zeros_like(p) if p.grad is None else p.grad for p in self.params]

    def gradient(self, loss: torch.Tensor) -> list[torch.Tensor]:
        """`loss`'s gradient, leaving `.grad` alone; the graph is kept for the next one."""
        grads = torch.autograd.grad(loss, self.params, retain_graph=True, allow_unused=True)
        return [torch.zeros_like(p) if g is None else g for p, g in zip(self.params, grads)]


@dataclass
class CountSketch:
    """A seeded random projection of a gradient to `size` numbers (a count sketch: each coordinate added, with a
    random sign, to a random bucket). It is linear, so the sketch of a sum is the sum of the sketches, and the
    squared norm of a sketch is an unbiased estimate of the gradient's. The buckets and signs are drawn again from
    the seed at each use, `chunk` coordinates at a time: nothing of the gradient's size is kept."""

    size: int
    seed: int
    chunk: int = 1 << 20

    def __call__(self, tensors: list[torch.Tensor]) -> torch.Tensor:  # -> (size,) float32
        device = tensors[0].device
        sketch = torch.zeros(self.size, dtype=torch.float32, device=device)
        for index, tensor in enumerate(tensors):
            flat = tensor.detach().reshape(-1)
            for start in range(0, flat.numel(), self.chunk):
                part = flat[start : start + self.chunk].float()
                generator = torch.Generator(device=device).manual_seed(self._seed(index, start))
                buckets = torch.randint(self.size, part.shape, generator=generator, device=device)
                signs = torch.randint(2, part.shape, generator=generator, device=device) * 2 - 1
                sketch.index_add_(0, buckets, part * signs)
        return sketch

    def _seed(self, index: int, start: int) -> int:
        return (self.seed * 1_000_003 + index * 65_537 + start // self.chunk) % (2**63)


def compared(shadow: list[torch.Tensor], trained: list[torch.Tensor], groups: list[str]) -> dict[str, float]:
    """The shadow gradient against the trained one: cosine, norm ratio, and per parameter group the share of
    coordinates where both are non-zero whose signs agree."""
    names = sorted(set(groups))
    totals = torch.zeros(3 + 2 * len(names), dtype=torch.float64, device=trained[0].device)  # read once
    for s, t, group in zip(shadow, trained, groups):
        s, t = s.double(), t.double()
        nonzero = (s != 0) & (t != 0)
        at = 3 + 2 * names.index(group)
        totals[0] += (s * t).sum()
        totals[1] += s.square().sum()
        totals[2] += t.square().sum()
        totals[at] += (nonzero & ((s > 0) == (t > 0))).sum()
        totals[at + 1] += nonzero.sum()
    dot, shadow_sq, trained_sq, *counts = totals.tolist()
    shadow_norm, trained_norm = math.sqrt(shadow_sq), math.sqrt(trained_sq)
    metrics = {
        "grad_cosine": dot / (shadow_norm * trained_norm) if shadow_norm and trained_norm else math.nan,
        "grad_norm_ratio": shadow_norm / trained_norm if trained_norm else math.nan,
    }
    agree, both = counts[0::2], counts[1::2]
    for name, agreed, counted in zip(names, agree, both):
        metrics[f"grad_sign_agreement/{name}"] = agreed / counted if counted else math.nan
    metrics["grad_sign_agreement/all"] = sum(agree) / sum(both) if sum(both) else math.nan
    return metrics


def split_gradients(
    loss_of: Callable[[torch.Tensor], torch.Tensor], trainable: Trainable, groups: dict[str, torch.Tensor]
) -> Iterator[tuple[str, list[torch.Tensor]]]:
    """Each group's gradient, one at a time: `loss_of(row_weights)` is the objective with each row's share of the
    loss weighted (1 inside the group, 0 outside); `groups` maps a name to its (B,) boolean rows."""
    for name, rows in groups.items():
        yield name, trainable.gradient(loss_of(rows.float()))


@dataclass
class NoiseScale:
    """The "simple" gradient noise scale B = tr(Sigma) / |G|^2 of McCandlish et al. 2018 ("An Empirical Model of
    Large-Batch Training", https://arxiv.org/abs/1812.06162, appendix A.1), from gradients of two batch sizes:
    E|G_B|^2 = |G|^2 + tr(Sigma) / B for the mean gradient G_B of B samples. Both unbiased estimates are smoothed
    over steps (with decay `ema`) before their ratio is taken, as the paper advises."""

    ema: float
    true_sq: float | None = None
    trace: float | None = None

    @staticmethod
    def estimate(small_sq: list[float], small: float, big_sq: float, big: float) -> tuple[float, float]:
        """(|G|^2, tr(Sigma)) from the squared norms of mean gradients over `small` samples (several) and over
        `big` samples (one)."""
        small_mean = sum(small_sq) / len(small_sq)
        true_sq = (big * big_sq - small * small_mean) / (big - small)
        trace = (small_mean - big_sq) / (1 / small - 1 / big)
        return true_sq, trace

    def update(self, small_sq: list[float], small: float, big_sq: float, big: float) -> dict[str, float]:
        true_sq, trace = self.estimate(small_sq, small, big_sq, big)
        if self.true_sq is None:
            self.true_sq, self.trace = true_sq, trace
        else:
            self.true_sq = self.ema * self.true_sq + (1 - self.ema) * true_sq
            self.trace = self.ema * self.trace + (1 - self.ema) * trace
        return {
            "grad/true_norm_sq": true_sq,
            "grad/trace_sigma": trace,
            "grad/noise_scale": self.trace / self.true_sq if self.true_sq > 0 else math.nan,
            # |G|^2 against the variance tr(Sigma) / big of the step's gradient: its signal-to-noise ratio
            "grad/snr": self.true_sq * big / self.trace if self.trace > 0 else math.nan,
        }
