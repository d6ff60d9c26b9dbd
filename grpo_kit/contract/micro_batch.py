"""The rows the policy is trained on: prompts, completions and what the objective reads of each, as tensors.

A generation batch leaves the rollout as one `MicroBatch` of all its rows; training/batches.py cuts it into the
micro-batches of the steps (`rows`, `cut`) and adds what it decides once (old and reference log-probs, the rollout
correction's ratio, `with_references`). Every pass over a micro-batch (the objective, the log-probs, length groups,
token budgets, packing, images) reads it through these fields, and splits it through these methods alone.
"""

from dataclasses import dataclass, fields, replace

import torch


@dataclass(frozen=True)
class RowSpans:
    """Where a micro-batch's rows' tokens lie, as far as a pass needs it, held on the host so that no pass reads
    the GPU to decide (grpo_kit/model/fast/mask_free.py). A subset of the rows reads its own."""

    one_span: bool  # every row's prompt and completion tokens are one span between padding
    longest_shift: int  # the most padding before any row's first token: the farthest a row moves


@dataclass(frozen=True)
class MicroBatch:
    prompt_ids: torch.Tensor  # (B, P) left-padded
    prompt_mask: torch.Tensor  # (B, P)
    completion_ids: torch.Tensor  # (B, T) right-padded, up to and including each completion's EOS
    completion_mask: torch.Tensor  # (B, T) the completion's tokens (0 for a truncated one under mask_truncated_...)
    advantages: torch.Tensor  # (B,)
    rewards: torch.Tensor | None = None  # (B,) each completion's weighted reward sum, NaN where none had an opinion
    tool_mask: torch.Tensor | None = None  # (B, T) 1 where the model wrote the token, 0 where a tool did
    sampling_per_token_logps: torch.Tensor | None = None  # (B, T) the sampler's, when a rollout correction asks
    old_per_token_logps: torch.Tensor | None = None  # (B, T) pi_old's, once the policy may have moved
    ref_per_token_logps: torch.Tensor | None = None  # (B, T) the reference model's, when algorithm.beta > 0
    importance_sampling_ratio: torch.Tensor | None = None  # (B, T) or (B, 1): the rollout correction's
    pixel_values: torch.Tensor | None = None  # (B, P_img, C) each row's image patches, zero-padded (model/vision.py)
    image_grid_thw: torch.Tensor | None = None  # (B, I, 3) each row's images' patch grids, zero-padded
    # (B,) the optimizer steps of the weights that sampled each row, where a generation batch's rows differ (under
    # asynchronous generation a dynamic-sampling redraw is sampled by newer weights); None: all the batch's version
    weight_versions: torch.Tensor | None = None
    row_spans: RowSpans | None = None  # recorded once per generation batch; None: a pass reads them

    def loss_mask(self) -> torch.Tensor:  # (B, T)
        """The tokens the loss is computed on: the completion's, less what tools wrote into it."""
        return self.completion_mask if self.tool_mask is None else self.completion_mask * self.tool_mask

    def __len__(self) -> int:
        return len(self.completion_ids)

    @property
    def width(self) -> int:
        """The completion columns T."""
        return self.completion_ids.shape[1]

    def rows(self, index: torch.Tensor) -> "MicroBatch":
        """The micro-batch of the rows `index` picks, in its order; their RowSpans are read anew."""
        picked = {name: value[index] for name, value in self._tensors().items()}
        return replace(self, **picked, row_spans=None)

    def cut(self, width: int) -> "MicroBatch":
        """The completion columns cut to the first `width` (the columns beyond are padding of every row)."""
        cut = {name: value[:, :width] for name, value in self._tensors().items() if _completion_wide(name, value)}
        return replace(self, **cut)

    def padded(self, extra: int) -> "MicroBatch":
        """Every completion column padded on the right by `extra` masked columns, which no loss or mask reads."""
        wide = {name: value for name, value in self._tensors().items() if _completion_wide(name, value)}
        return replace(self, **{name: torch.nn.functional.pad(value, (0, extra)) for name, value in wide.items()})

    def with_references(self, **tensors: torch.Tensor | None) -> "MicroBatch":
        """This micro-batch with old or reference log-probs, or a rollout-correction ratio, added."""
        return replace(self, **tensors)

    def to(self, device: torch.device | str) -> "MicroBatch":
        return replace(self, **{name: value.to(device) for name, value in self._tensors().items()})

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Its tensors on the CPU, for a checkpoint (RowSpans are read again after a resume)."""
        return {name: value.cpu() for name, value in self._tensors().items()}

    @classmethod
    def from_state_dict(cls, state: dict[str, torch.Tensor], device: torch.device | str) -> "MicroBatch":
        return cls(**{name: value.to(device) for name, value in state.items()})

    def _tensors(self) -> dict[str, torch.Tensor]:
        return {
            field.name: getattr(self, field.name)
            for field in fields(self)
            if isinstance(getattr(self, field.name), torch.Tensor)
        }


# (B, T) fields besides the completion's own ids and mask; a (B, 1) ratio is a sequence-level one
_PER_TOKEN = frozenset(
    {"tool_mask", "sampling_per_token_logps", "old_per_token_logps", "ref_per_token_logps", "importance_sampling_ratio"}
)


def _completion_wide(name: str, value: torch.Tensor) -> bool:
    """Whether a field runs along the completion columns: not the prompts, the images, nor a (B, 1) ratio."""
    return name in ("completion_ids", "completion_mask") or (name in _PER_TOKEN and value.shape[1] != 1)
