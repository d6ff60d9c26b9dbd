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

As TRL does, the batch is shuffled and cut into micro-batches of equal size (its rows are a `MicroBatch`,
grpo_kit/contract/micro_batch.py, cut by its own `rows` and `cut`). Two things are ours, both leaving a
step's gradient what it was: each micro-batch is cut to its own longest completion, not the batch's (the columns it
drops are padding, which no loss, mask or metric reads; prompts keep the batch's padding, which sets their tokens'
positions); and with `trainer.group_by_length`, the completions of one optimizer step are sorted by length before
the cut, so that each micro-batch pads little (docs/training.md, "Speed-ups"). With trainer.max_tokens_per_micro_batch,
a step's completions are cut by a token budget instead (token_budget.py), and each micro-step may hold several
micro-batches.
"""

import contextlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

import torch

from grpo_kit.contract.errors import ConfigError
from grpo_kit.contract.kinds import Reduction, declared
from grpo_kit.contract.micro_batch import MicroBatch
from grpo_kit.contract.pipeline import Run, ScoredBatch
from grpo_kit.model.fast.mask_free import with_row_spans
from grpo_kit.objective.objective import ObjectiveOutput
from grpo_kit.objective.policy_loss import PolicyLoss
from grpo_kit.objective.sampler_correction import SamplerCorrection
from grpo_kit.rollout.rollout import Rollout
from grpo_kit.training.plan import BatchPlan
from grpo_kit.training.staleness import LaggedWeights
from grpo_kit.training.token_budget import TokenBudget, in_parts


@dataclass
class GenerationBatch:
    """One generation batch: its micro-batches, the divisors of its losses, its metrics.

    `weight_version` is the number of optimizer steps the weights that generated it had taken. A synchronous run
    trains on a batch from the step it was generated at; asynchronous generation (algorithm.max_staleness) makes
    batches ahead, with older weights, and reads how far behind they are from it; forced staleness
    (algorithm.forced_staleness) generates it with the weights of exactly k steps before.
    """

    micro_batches: list[MicroBatch]  # on the device
    reduction: Reduction
    metrics: dict[str, float]  # the rollout's over every process, and the sampler mismatch
    weight_version: int
    tokens: int  # prompt and completion tokens of every process (TRL's num_tokens counts them)
    old_from_first_pass: set[int] = field(default_factory=set)  # micro-batches awaiting their first training pass
    scored: ScoredBatch | None = None  # its completions and rewards for the sample log: not saved
    advantages: torch.Tensor | None = None  # (N,)
    position: int = 0  # the micro-batch `next` handed out last

    def next(self, micro_step: int) -> MicroBatch:
        """The micro-batch the run's `micro_step`-th micro-step trains on."""
        self.position = micro_step % len(self.micro_batches)
        return self.micro_batches[self.position]

    def trained(self, out: ObjectiveOutput) -> None:
        """The first training pass over the micro-batch `next` handed out came before the policy moved: its
        log-probs are the old ones of the passes to come."""
        if self.position in self.old_from_first_pass:
            trained = self.micro_batches[self.position].with_references(old_per_token_logps=out.per_token_logps)
            self.micro_batches[self.position] = trained
            self.old_from_first_pass = self.old_from_first_pass - {self.position}

    def copy(self) -> "GenerationBatch":
        """A copy that `trained` leaves alone (a micro-batch is replaced, never changed in place)."""
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
            "micro_batches": [batch.state_dict() for batch in self.micro_batches],
            "reduction": asdict(self.reduction),
            "metrics": self.metrics,
            "weight_version": self.weight_version,
            "tokens": self.tokens,
            "old_from_first_pass": sorted(self.old_from_first_pass),
        }

    @classmethod
    def from_state_dict(cls, state: dict, device: torch.device) -> "GenerationBatch":
        return cls(
            [MicroBatch.from_state_dict(batch, device) for batch in state["micro_batches"]],
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
    policy: torch.nn.Module  # prepared by the accelerator: old log-probs come from it
    reference: Callable | None  # the frozen reference model, when algorithm.beta > 0
    accelerator: object
    plan: BatchPlan
    max_completion_length: int
    correction: SamplerCorrection  # the rollout correction: whether it applies, its ratio, its metrics
    by_length: bool = False  # trainer.group_by_length, as `group_by_length` resolved it
    budget: TokenBudget = TokenBudget(None, False)  # trainer.max_tokens_per_micro_batch and trainer.packing
    lagged: LaggedWeights | None = None  # algorithm.forced_staleness: the older weights that generate

    @torch.no_grad()
    def make(self, run: Run, micro_step: int, weight_version: int) -> GenerationBatch:
        """This process's next prompts as a generation batch, to be trained on from `micro_step` by weights of
        `weight_version` optimizer steps."""
        plan = self.plan
        # Under forced staleness the policy holds older weights while it generates, and its own ones again before
        # any log-prob below: the batch's weight_version is the older one.
        serving = contextlib.nullcontext(weight_version) if self.lagged is None else self.lagged.serving(weight_version)
        with serving as sampled_by:
            rollouts = self.rollout(run, plan.prompts_per_generation, sampled_by)
        rows = rollouts.training_rows.to(self.accelerator.device)
        reduction = Reduction(  # token normalisers (dapo, cispo) count the whole batch, every process's
            num_items_in_batch=float(self.accelerator.gather(rows.loss_mask().sum()).sum()),
            gradient_accumulation_steps=plan.accumulation,
            steps_per_generation=plan.steps_per_generation,
            num_processes=self.accelerator.num_processes,
            max_completion_length=self.max_completion_length,
            rows_per_micro_batch=self.rows_per_micro_batch(rows),
        )
        micro_batches = split(rows, plan.steps_per_generation, plan.accumulation, self.by_length, self.budget)
        micro_batches = with_row_spans(micro_batches)  # what every pass over them decides by: no pass reads the GPU
        old_from_first_pass = set()
        moved = moves_before_use(micro_step, plan.steps_per_generation, plan.accumulation)
        for position, policy_moved in enumerate(moved):
            micro_batches[position] = self.with_references(micro_batches[position], policy_moved)
            if micro_batches[position].old_per_token_logps is None and plan.off_policy:
                old_from_first_pass.add(position)
        metrics = rollouts.metrics
        if micro_batches[0].importance_sampling_ratio is not None:
            metrics |= self.correction.metrics(micro_batches, self.accelerator)
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

    def rows_per_micro_batch(self, rows: MicroBatch) -> float | None:
        """The completions of a fixed micro-batch, which sequence means divide by when a token budget makes the
        micro-batches' sizes differ; None without one."""
        if self.budget.max_tokens is None:
            return None
        return len(rows) / self.plan.steps_per_generation

    @torch.no_grad()
    def with_references(self, micro_batch: MicroBatch, moved: bool = True) -> MicroBatch:
        """The micro-batch with its old, reference and rollout-correction terms. `moved`: the policy takes an
        optimizer step before the micro-batch is first trained on."""
        corrected = micro_batch.sampling_per_token_logps is not None and self.correction.applies
        if (self.plan.off_policy and moved) or corrected:
            old, _ = in_parts(lambda part: self.policy_loss.logps(self.policy, part), micro_batch, self.budget)
            micro_batch = micro_batch.with_references(old_per_token_logps=old)
        if corrected:
            micro_batch = micro_batch.with_references(importance_sampling_ratio=self.correction.ratio(micro_batch))
        if self.reference is not None:
            with self.accelerator.autocast():
                ref, _ = in_parts(lambda part: self.policy_loss.logps(self.reference, part), micro_batch, self.budget)
            micro_batch = micro_batch.with_references(ref_per_token_logps=ref)
        return micro_batch


def group_by_length(cfg, loss, steps_per_generation: int, router_aux_loss_coef: float = 0.0) -> bool:
    """Whether this run groups completions by length: `trainer.group_by_length`, or where it cannot change the
    gradient when that is null; a request it would change the gradient of is refused."""
    reasons = grouping_changes_gradient(cfg, loss, steps_per_generation, router_aux_loss_coef)
    requested = cfg.trainer.group_by_length
    if requested and reasons:
        raise ConfigError(
            "trainer.group_by_length=true would change the gradient of this run's steps, because "
            + "; ".join(reasons)
            + ". Leave it null (grouping where it changes nothing) or false."
        )
    return not reasons if requested is None else requested


def token_budget(cfg, loss, steps_per_generation: int, router_aux_loss_coef: float = 0.0) -> TokenBudget:
    """trainer.max_tokens_per_micro_batch and trainer.packing; a budget that would change the gradient is refused."""
    t = cfg.trainer
    max_tokens = t.max_tokens_per_micro_batch
    if max_tokens is not None:
        if max_tokens < 1:
            raise ConfigError(f"trainer.max_tokens_per_micro_batch={max_tokens} must be at least 1 (or null).")
        reasons = grouping_changes_gradient(cfg, loss, steps_per_generation, router_aux_loss_coef)
        if reasons:
            raise ConfigError(
                f"trainer.max_tokens_per_micro_batch={max_tokens} would change the gradient of this run's steps, "
                "because " + "; ".join(reasons) + ". Leave it null (micro-batches of per_device_train_batch_size)."
            )
    return TokenBudget(max_tokens, bool(t.packing))


def grouping_changes_gradient(cfg, loss, steps_per_generation: int, router_aux_loss_coef: float = 0.0) -> list[str]:
    """Why regrouping a step's completions into other micro-batches would change its gradient (none: it would not).
    `router_aux_loss_coef`: the weight of a mixture-of-experts model's load-balancing loss, once the model is known."""
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
    if router_aux_loss_coef != 0.0:
        reasons.append(
            "the router load-balancing loss of this mixture-of-experts model is computed over each micro-batch's "
            "tokens (algorithm.router_aux_loss_coef=0 turns it off)"
        )
    if steps_per_generation % accumulation:
        reasons.append(
            f"a generation batch of {steps_per_generation} micro-batches is not a whole number of steps "
            f"of {accumulation}"
        )
    return reasons


def split(
    rows: MicroBatch,
    steps_per_generation: int,
    accumulation: int,
    by_length: bool,
    budget: TokenBudget | None = None,
) -> list[MicroBatch]:
    """A generation batch's `rows` as `steps_per_generation` micro-batches, shuffled; with `by_length`, each
    optimizer step's share is sorted by completion length first; with a token budget, each step's share is spread
    over its micro-steps by the budget (TokenBudget.spread). Each is cut to its own longest completion."""
    lengths = rows.completion_mask.sum(dim=1)  # (N,)
    order = torch.randperm(len(lengths), device=lengths.device)  # (N,)
    steps = steps_per_generation // accumulation
    if budget is not None and budget.max_tokens is not None:
        micro_steps = [picked for share in order.chunk(steps) for picked in budget.spread(rows, share, accumulation)]
    else:
        if by_length:
            order = torch.cat([share[lengths[share].argsort(stable=True)] for share in order.chunk(steps)])
        micro_steps = order.chunk(steps_per_generation)
    # The longest completion that is trained on sets each micro-batch's width.
    return [rows.rows(picked).cut(max(int(lengths[picked].max()), 1)) for picked in micro_steps]


def moves_before_use(micro_step: int, steps_per_generation: int, accumulation: int) -> list[bool]:
    """For each micro-batch of a generation batch made at `micro_step`: whether an optimizer step comes before
    the micro-batch is first trained on, so that the policy is no longer the one that generated it."""
    step = micro_step // accumulation
    return [(micro_step + index) // accumulation != step for index in range(steps_per_generation)]


def tokens_seen(scored: ScoredBatch, accelerator) -> int:
    """The prompt and completion tokens of a generation batch on every process, as TRL counts them for its
    num_tokens: each prompt's own length, and the tokens the model wrote (tool output left out)."""
    local = sum(len(ids) for ids in scored.prompt_ids) + int(scored.generated.written_mask().sum())
    return int(accelerator.gather(torch.tensor([local], device=accelerator.device)).sum())
