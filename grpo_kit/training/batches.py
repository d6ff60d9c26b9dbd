"""A generation batch cut into micro-batches: which completions train together, and how much padding they carry.

As TRL does, the batch is shuffled and cut into `steps_per_generation` micro-batches of equal size. Two things are
ours, both leaving a step's gradient what it was:
- each micro-batch is cut to its own longest completion, not the batch's: the columns it drops are padding, which
  no loss, mask or metric reads (prompts keep the batch's padding, which sets the positions of their tokens);
- with `trainer.group_by_length`, the completions of one optimizer step are sorted by length before the cut, so
  that each micro-batch holds completions of similar lengths and pads little. The step trains on the same
  completions, and a loss that declares `accumulation_invariant` gives the same gradient however they are split.
"""

import torch

from grpo_kit.contract.errors import ConfigError
from grpo_kit.contract.kinds import declared

COMPLETION_COLUMNS = ("completion_ids", "completion_mask", "sampling_per_token_logps", "tool_mask")  # (N, T) each


def group_by_length(cfg, loss, steps_per_generation: int) -> bool:
    """Whether this run groups completions by length: `trainer.group_by_length`, or where it cannot change the
    gradient when that is null; a request it would change the gradient of is refused."""
    algo, accumulation = cfg.algorithm, cfg.trainer.gradient_accumulation_steps
    reasons = []
    if not declared(loss, "loss", "accumulation_invariant"):
        reasons.append(f"loss {cfg.loss.name} divides by something its micro-batch decides (it does not declare "
                       "accumulation_invariant)")
    if algo.top_entropy_quantile < 1.0:
        reasons.append("algorithm.top_entropy_quantile takes the quantile of each micro-batch's entropies")
    if algo.entropy_coef != 0.0 or algo.use_adaptive_entropy:
        reasons.append("algorithm.entropy_coef rewards each micro-batch's mean entropy")
    if steps_per_generation % accumulation:
        reasons.append(f"a generation batch of {steps_per_generation} micro-batches is not a whole number of steps "
                       f"of {accumulation}")
    requested = cfg.trainer.group_by_length
    if requested and reasons:
        raise ConfigError(
            "trainer.group_by_length=true would change the gradient of this run's steps, because "
            + "; ".join(reasons) + ". Leave it null (grouping where it changes nothing) or false."
        )
    return not reasons if requested is None else requested


def split(batch: dict[str, torch.Tensor], steps_per_generation: int, accumulation: int, by_length: bool) -> list[dict]:
    """`batch` (every tensor N rows, or 0-dim) as `steps_per_generation` micro-batches, shuffled; with `by_length`,
    each optimizer step's share is sorted by completion length first."""
    lengths = batch["completion_mask"].sum(dim=1)  # (N,)
    order = torch.randperm(len(lengths), device=lengths.device)  # (N,)
    if by_length:
        steps = steps_per_generation // accumulation
        order = torch.cat([share[lengths[share].argsort(stable=True)] for share in order.chunk(steps)])
    micro_batches = []
    for rows in order.chunk(steps_per_generation):
        micro_batch = {name: tensor if tensor.dim() == 0 else tensor[rows] for name, tensor in batch.items()}
        width = max(int(lengths[rows].max()), 1)  # the longest completion that is trained on
        for name in COMPLETION_COLUMNS:
            if name in micro_batch:
                micro_batch[name] = micro_batch[name][:, :width]  # (B, width)
        micro_batches.append(micro_batch)
    return micro_batches


def moves_before_use(micro_step: int, steps_per_generation: int, accumulation: int) -> list[bool]:
    """For each micro-batch of a generation batch made at `micro_step`: whether an optimizer step comes before
    the micro-batch is first trained on, so that the policy is no longer the one that generated it."""
    step = micro_step // accumulation
    return [(micro_step + index) // accumulation != step for index in range(steps_per_generation)]
