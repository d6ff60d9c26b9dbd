"""The one owner of a generation batch, from its rollout to the last micro-batch trained on it.

A generation batch is `steps_per_generation` micro-batches of `per_device_train_batch_size` completions on each
process, trained on `num_iterations` times (TRL's batch sizes). `GenerationBatches.make` decides, once, everything
the objective needs beyond a micro-batch's own forward pass:
- old log-probs, once the policy may have moved since the batch was generated: computed at generation for the
  micro-batches an optimizer step comes before, and kept from the first training pass for the others;
- the reference model's log-probs (algorithm.beta > 0) and the rollout correction's ratio (with the sampler's
  log-probs, when a correction is selected);
- the divisors every loss and Liger read: one `Reduction` for the whole batch;
- the sampler-mismatch metrics and what the sample log shows.

As TRL does, the batch is shuffled and cut into micro-batches of equal size. Two things are ours, both leaving a
step's gradient what it was: each micro-batch is cut to its own longest completion, not the batch's (the columns it
drops are padding, which no loss, mask or metric reads; prompts keep the batch's padding, which sets their tokens'
positions); and with `trainer.group_by_length`, the completions of one optimizer step are sorted by length before
the cut, so that each micro-batch pads little (docs/training.md, "Speed-ups"). With trainer.max_tokens_per_micro_batch,
a step's completions are cut by a token budget instead (token_budget.py), and each micro-step may hold several
micro-batches.
"""

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

import torch

from grpo_kit.contract.errors import ConfigError
from grpo_kit.contract.kinds import Reduction, declared
from grpo_kit.contract.pipeline import Run, ScoredBatch
from grpo_kit.model.fast.mask_free import record_row_spans
from grpo_kit.objective.objective import loss_mask
from grpo_kit.objective.policy_loss import PolicyLoss
from grpo_kit.rollout.rollout import Rollout
from grpo_kit.training.token_budget import TokenBudget, in_parts

COMPLETION_COLUMNS = ("completion_ids", "completion_mask", "sampling_per_token_logps", "tool_mask")  # (N, T) each


@dataclass
class GenerationBatch:
    """One generation batch: its micro-batches, the divisors of its losses, its metrics.

    `weight_version` is the number of optimizer steps the weights that generated it had taken. A synchronous run
    trains on a batch from the step it was generated at; asynchronous generation (algorithm.max_staleness) makes
    batches ahead, with older weights, and reads how far behind they are from it.
    """

    micro_batches: list[dict[str, torch.Tensor]]  # each (B, ...) on the device
    reduction: Reduction
    metrics: dict[str, float]  # the rollout's over every process, and the sampler mismatch
    weight_version: int
    tokens: int  # prompt and completion tokens of every process (TRL's num_tokens counts them)
    old_from_first_pass: set[int] = field(default_factory=set)  # micro-batches awaiting their first training pass
    scored: ScoredBatch | None = None  # its completions and rewards for the sample log: not saved
    advantages: torch.Tensor | None = None  # (N,)

    def trained_on(self, position: int, per_token_logps: torch.Tensor) -> None:
        """A micro-batch's first training pass came before the policy moved: its log-probs are the old ones of
        the passes to come."""
        if position in self.old_from_first_pass:
            self.micro_batches[position] = self.micro_batches[position] | {"old_per_token_logps": per_token_logps}
            self.old_from_first_pass = self.old_from_first_pass - {position}

    def copy(self) -> "GenerationBatch":
        """A copy that `trained_on` leaves alone (a micro-batch is replaced, never changed in place)."""
        return replace(self, micro_batches=list(self.micro_batches))

    def sample_columns(self, reward_names: list[str]) -> tuple:
        """What `SampleLog.record` shows after the step: prompts, completions, rewards, advantages, lengths."""
        scored = self.scored
        return (
            scored.prompts,
            scored.completions,
            scored.rewards_per_func,
            reward_names,
            self.advantages,
            scored.generated,
            scored.extra_columns,
        )

    def state_dict(self) -> dict:
        return {
            # Tensors only: a resumed batch's passes read their RowSpans again (fast/mask_free.py).
            "micro_batches": [
                {name: tensor.cpu() for name, tensor in batch.items() if isinstance(tensor, torch.Tensor)}
                for batch in self.micro_batches
            ],
            "reduction": asdict(self.reduction),
            "metrics": self.metrics,
            "weight_version": self.weight_version,
            "tokens": self.tokens,
            "old_from_first_pass": sorted(self.old_from_first_pass),
        }

    @classmethod
    def from_state_dict(cls, state: dict, device: torch.device) -> "GenerationBatch":
        micro_batches = [
            {name: tensor.to(device) for name, tensor in batch.items()} for batch in state["micro_batches"]
        ]
        return cls(
            micro_batches,
            Reduction(**state["reduction"]),
            state["metrics"],
            state["weight_version"],
            state["tokens"],
            set(state["old_from_first_pass"]),
        )


@dataclass
class GenerationBatches:
    """Makes each generation batch: rollout -> micro-batches -> old, reference and rollout-correction terms."""

    rollout: Rollout  # generate -> score -> advantages
    policy_loss: PolicyLoss  # its log-probs are the trained ones, so old and reference log-probs come from it too
    reference: Callable | None  # the frozen reference model, when algorithm.beta > 0
    accelerator: object
    steps_per_generation: int  # micro-batches in a generation batch
    accumulation: int  # micro-batches in an optimizer step
    num_iterations: int  # passes over each generation batch
    max_completion_length: int
    by_length: bool = False  # trainer.group_by_length, as `group_by_length` resolved it
    corrects_rollouts: bool = False  # a rollout correction is selected and applies to this sampler (compatibility.py)
    budget: TokenBudget = TokenBudget(None, False)  # trainer.max_tokens_per_micro_batch and trainer.packing

    @property
    def micro_steps_per_batch(self) -> int:
        return self.steps_per_generation * self.num_iterations

    @property
    def off_policy(self) -> bool:
        """Whether the policy may move between a batch's generation and its last pass: then it needs old log-probs."""
        return self.accumulation % self.micro_steps_per_batch != 0

    def due(self, micro_step: int) -> bool:
        return micro_step % self.micro_steps_per_batch == 0

    @torch.no_grad()
    def make(self, run: Run, policy, num_prompts: int, micro_step: int, weight_version: int) -> GenerationBatch:
        """This process's next `num_prompts` prompts as a generation batch, to be trained on from `micro_step` by
        weights of `weight_version` optimizer steps."""
        rollouts = self.rollout(run, num_prompts, weight_version)
        batch = {name: tensor.to(self.accelerator.device) for name, tensor in rollouts.tensors.items()}
        reduction = Reduction(  # token normalisers (dapo, cispo) count the whole batch, every process's
            num_items_in_batch=float(self.accelerator.gather(loss_mask(batch).sum()).sum()),
            gradient_accumulation_steps=self.accumulation,
            steps_per_generation=self.steps_per_generation,
            num_processes=self.accelerator.num_processes,
            max_completion_length=self.max_completion_length,
            rows_per_micro_batch=self.rows_per_micro_batch(batch),
        )
        micro_batches = split(batch, self.steps_per_generation, self.accumulation, self.by_length, self.budget)
        record_row_spans(micro_batches)  # what every pass over them decides by, so that no pass reads the GPU
        old_from_first_pass = set()
        moved = moves_before_use(micro_step, self.steps_per_generation, self.accumulation)
        for position, (micro_batch, policy_moved) in enumerate(zip(micro_batches, moved)):
            if not self.add_references(policy, micro_batch, policy_moved) and self.off_policy:
                old_from_first_pass.add(position)
        metrics = rollouts.metrics
        if "importance_sampling_ratio" in micro_batches[0]:
            metrics |= sampler_mismatch(micro_batches, self.accelerator)
        return GenerationBatch(
            micro_batches,
            reduction,
            metrics,
            rollouts.weight_version,
            tokens_seen(rollouts.scored, self.accelerator),
            old_from_first_pass,
            rollouts.scored,
            rollouts.advantages,
        )

    def rows_per_micro_batch(self, batch: dict[str, torch.Tensor]) -> float | None:
        """The completions of a fixed micro-batch, which sequence means divide by when a token budget makes the
        micro-batches' sizes differ; None without one."""
        if self.budget.max_tokens is None:
            return None
        return len(batch["completion_mask"]) / self.steps_per_generation

    @torch.no_grad()
    def add_references(self, policy, micro_batch: dict[str, torch.Tensor], moved: bool = True) -> bool:
        """Add the micro-batch's old, reference and rollout-correction terms; whether it now has old log-probs.
        `moved`: the policy takes an optimizer step before the micro-batch is first trained on."""
        sampling = micro_batch.get("sampling_per_token_logps")
        corrected = sampling is not None and self.corrects_rollouts
        if (self.off_policy and moved) or corrected:
            micro_batch["old_per_token_logps"], _ = in_parts(
                lambda part: self.policy_loss.logps(policy, part), micro_batch, self.budget
            )
        if corrected:
            micro_batch["importance_sampling_ratio"] = self.policy_loss.objective.rollout_correction(
                micro_batch["old_per_token_logps"], sampling, loss_mask(micro_batch)
            )
        if self.reference is not None:
            with self.accelerator.autocast():
                micro_batch["ref_per_token_logps"], _ = in_parts(
                    lambda part: self.policy_loss.logps(self.reference, part), micro_batch, self.budget
                )
        return "old_per_token_logps" in micro_batch


def group_by_length(cfg, loss, steps_per_generation: int) -> bool:
    """Whether this run groups completions by length: `trainer.group_by_length`, or where it cannot change the
    gradient when that is null; a request it would change the gradient of is refused."""
    reasons = grouping_changes_gradient(cfg, loss, steps_per_generation)
    requested = cfg.trainer.group_by_length
    if requested and reasons:
        raise ConfigError(
            "trainer.group_by_length=true would change the gradient of this run's steps, because "
            + "; ".join(reasons)
            + ". Leave it null (grouping where it changes nothing) or false."
        )
    return not reasons if requested is None else requested


def token_budget(cfg, loss, steps_per_generation: int) -> TokenBudget:
    """trainer.max_tokens_per_micro_batch and trainer.packing; a budget that would change the gradient is refused."""
    t = cfg.trainer
    max_tokens = t.max_tokens_per_micro_batch
    if max_tokens is not None:
        if max_tokens < 1:
            raise ConfigError(f"trainer.max_tokens_per_micro_batch={max_tokens} must be at least 1 (or null).")
        reasons = grouping_changes_gradient(cfg, loss, steps_per_generation)
        if reasons:
            raise ConfigError(
                f"trainer.max_tokens_per_micro_batch={max_tokens} would change the gradient of this run's steps, "
                "because " + "; ".join(reasons) + ". Leave it null (micro-batches of per_device_train_batch_size)."
            )
    return TokenBudget(max_tokens, bool(t.packing))


def grouping_changes_gradient(cfg, loss, steps_per_generation: int) -> list[str]:
    """Why regrouping a step's completions into other micro-batches would change its gradient (none: it would not)."""
    algo, accumulation = cfg.algorithm, cfg.trainer.gradient_accumulation_steps
    reasons = []
    if not declared(loss, "loss", "accumulation_invariant"):
        reasons.append(
            f"loss {cfg.loss.name} divides by something its micro-batch decides (it does not declare "
            "accumulation_invariant)"
        )
    if algo.top_entropy_quantile < 1.0:
        reasons.append("algorithm.top_entropy_quantile takes the quantile of each micro-batch's entropies")
    if algo.entropy_coef != 0.0 or algo.use_adaptive_entropy:
        reasons.append("algorithm.entropy_coef rewards each micro-batch's mean entropy")
    if steps_per_generation % accumulation:
        reasons.append(
            f"a generation batch of {steps_per_generation} micro-batches is not a whole number of steps "
            f"of {accumulation}"
        )
    return reasons


def split(
    batch: dict[str, torch.Tensor],
    steps_per_generation: int,
    accumulation: int,
    by_length: bool,
    budget: TokenBudget | None = None,
) -> list[dict]:
    """`batch` (every tensor N rows, or 0-dim) as `steps_per_generation` micro-batches, shuffled; with `by_length`,
    each optimizer step's share is sorted by completion length first; with a token budget, each step's share is
    spread over its micro-steps by the budget (TokenBudget.spread)."""
    lengths = batch["completion_mask"].sum(dim=1)  # (N,)
    order = torch.randperm(len(lengths), device=lengths.device)  # (N,)
    steps = steps_per_generation // accumulation
    if budget is not None and budget.max_tokens is not None:
        micro_steps = [rows for share in order.chunk(steps) for rows in budget.spread(batch, share, accumulation)]
    else:
        if by_length:
            order = torch.cat([share[lengths[share].argsort(stable=True)] for share in order.chunk(steps)])
        micro_steps = order.chunk(steps_per_generation)
    micro_batches = []
    for rows in micro_steps:
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


def sampler_mismatch(micro_batches: list[dict], accelerator) -> dict[str, float]:
    """How far the sampler's log-probs are from the trainer's, and the rollout correction's ratio, over the whole
    generation batch (TRL's `sampling/` metrics)."""
    mask = torch.cat([loss_mask(mb) for mb in micro_batches]).bool()  # (N, T)
    ratio = torch.cat([mb["importance_sampling_ratio"] for mb in micro_batches])  # (N, T) or (N, 1)
    ratio = ratio[mask] if ratio.shape == mask.shape else ratio.view(-1)  # active tokens, or sequences
    difference = torch.cat([mb["old_per_token_logps"] - mb["sampling_per_token_logps"] for mb in micro_batches])
    difference = difference[mask].abs().float()
    ratio = ratio.float()
    # Each process's sums, counts and extremes, gathered: processes hold different numbers of tokens.
    local = torch.tensor(
        [
            difference.sum().item(),
            difference.max().item() if difference.numel() else 0.0,
            difference.numel(),
            ratio.sum().item(),
            ratio.min().item() if ratio.numel() else math.inf,
            ratio.max().item() if ratio.numel() else 0.0,
            ratio.numel(),
        ],
        device=accelerator.device,
    )
    every = accelerator.gather(local.unsqueeze(0))  # (processes, 7)
    return {
        "sampling/sampling_logp_difference/mean": (every[:, 0].sum() / every[:, 2].sum().clamp(min=1)).item(),
        "sampling/sampling_logp_difference/max": every[:, 1].max().item(),
        "sampling/importance_sampling_ratio/mean": (every[:, 3].sum() / every[:, 6].sum().clamp(min=1)).item(),
        "sampling/importance_sampling_ratio/min": every[:, 4].min().item(),
        "sampling/importance_sampling_ratio/max": every[:, 5].max().item(),
    }


def tokens_seen(scored: ScoredBatch, accelerator) -> int:
    """The prompt and completion tokens of a generation batch on every process, as TRL counts them for its
    num_tokens: each prompt's own length, and the tokens the model wrote (tool output left out)."""
    generated = scored.generated
    written = (
        generated.completion_mask if generated.tool_mask is None else generated.completion_mask * generated.tool_mask
    )
    local = sum(len(ids) for ids in scored.prompt_ids) + int(written.sum())
    return int(accelerator.gather(torch.tensor([local], device=accelerator.device)).sum())
