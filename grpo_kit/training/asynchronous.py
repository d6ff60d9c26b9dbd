"""algorithm.max_staleness: whether a run may generate ahead, and the worker that does (grpo_kit/rollout/ahead.py).

docs/async.md says when to use it and what it costs in off-policyness.
"""

import logging
import math

from omegaconf import DictConfig

from grpo_kit.contract.errors import ConfigError
from grpo_kit.contract.kinds import declared
from grpo_kit.rollout.ahead import GenerationAhead
from grpo_kit.rollout.rollout import Rollout
from grpo_kit.training.plan import BatchPlan

log = logging.getLogger(__name__)


def check_asynchronous(cfg: DictConfig, generation) -> None:
    """Refuse, before the model loads, what asynchronous generation cannot do."""
    staleness = cfg.algorithm.max_staleness
    if staleness < 0:
        raise ConfigError(f"algorithm.max_staleness={staleness} must be 0 (synchronous) or more.")
    if staleness == 0:
        return
    if declared(generation, "generation", "generate_in_background") is None:
        raise ConfigError(
            f"algorithm.max_staleness={staleness} needs a generation backend that generates beside training; "
            f"generation={cfg.generation.name} cannot (it has no generate_in_background). docs/async.md says which "
            "backends can, and why; or set algorithm.max_staleness=0."
        )
    conflicts = []
    if cfg.rollout_files.replay:
        conflicts.append("rollout_files.replay replays saved rollouts instead of generating")
    if cfg.rollout is not None:
        conflicts.append(f"+rollout={cfg.rollout.name} generates by itself")
    if cfg.tools or cfg.environment is not None:
        conflicts.append("tool use (+environment, tools=[...]) calls the tools on the training thread between turns")
    if conflicts:
        raise ConfigError(
            f"algorithm.max_staleness={staleness} generates ahead in a worker thread, but "
            + "; ".join(conflicts)
            + ": use algorithm.max_staleness=0 with it."
        )


def start_generating_ahead(ahead: GenerationAhead, rollout: Rollout, state, plan: BatchPlan) -> None:
    """Start the worker from where the run stands (its start, or a resumed checkpoint): the rollout takes its
    batches from it, and every other generation goes through it."""
    accumulation, micro_steps_per_batch = plan.accumulation, plan.micro_steps_per_batch
    next_batch_at = math.ceil(state.micro_step / micro_steps_per_batch) * micro_steps_per_batch

    def version_at_take(index: int) -> int:  # the weights' optimizer steps when the trainer takes batch `index`
        return (next_batch_at + index * micro_steps_per_batch) // accumulation

    if state.dropped_ahead:
        log.info(
            "Asynchronous generation: %d batch(es) generated ahead when the checkpoint was saved were not kept; "
            "their prompts are drawn again, and generated with the restored weights.",
            state.dropped_ahead,
        )
    ahead.start_worker(plan.prompts_per_generation, rollout.generate_rows, state.step, version_at_take)
