"""The run's batch arithmetic, computed once: how many completions each process generates, cuts and trains on.

The sizes are TRL's GRPOTrainer's. A micro-batch holds `per_device_train_batch_size` completions; an optimizer step
accumulates `gradient_accumulation_steps` micro-batches; a generation batch holds `steps_per_generation`
micro-batches (by default one optimizer step's worth, or as many as generation.batch_size, TRL's
generation_batch_size, fills) and is trained on `num_iterations` times before the next one is generated. Every other
module reads these numbers from the plan, and a run logs it in one line as it starts.
"""

import logging
import math
from dataclasses import dataclass

from omegaconf import DictConfig

from grpo_kit.contract.errors import ConfigError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchPlan:
    completions_per_micro_batch: int  # trainer.per_device_train_batch_size
    accumulation: int  # micro-batches per optimizer step: trainer.gradient_accumulation_steps
    steps_per_generation: int  # micro-batches per generation batch
    num_iterations: int  # passes over each generation batch
    num_generations: int  # completions per prompt
    num_processes: int
    max_steps: int  # optimizer steps of the whole run

    @classmethod
    def of(cls, cfg: DictConfig, num_processes: int, num_prompts: int) -> "BatchPlan":
        """The plan of `cfg` over `num_processes` processes and a dataset of `num_prompts` prompts; sizes that
        cannot work are refused."""
        t, algo = cfg.trainer, cfg.algorithm
        plan = cls(
            completions_per_micro_batch=t.per_device_train_batch_size,
            accumulation=t.gradient_accumulation_steps,
            steps_per_generation=steps_per_generation(cfg, num_processes),
            num_iterations=algo.num_iterations,
            num_generations=cfg.generation.num_generations,
            num_processes=num_processes,
            max_steps=t.max_steps,
        )
        if plan.generation_batch_size % plan.num_generations:
            raise ConfigError(
                f"Each process's generation batch holds per_device_train_batch_size x steps_per_generation = "
                f"{plan.generation_batch_size} completions, which is not a multiple of generation.num_generations="
                f"{plan.num_generations}: change one of them (every process generates whole groups of its own "
                "prompts)."
            )
        if plan.max_steps == -1:
            return cls(**{**vars(plan), "max_steps": plan.steps_in_epochs(t.num_train_epochs, num_prompts)})
        return plan

    @property
    def generation_batch_size(self) -> int:
        """The completions of one generation batch on this process."""
        return self.completions_per_micro_batch * self.steps_per_generation

    @property
    def prompts_per_generation(self) -> int:
        """This process's prompts in a generation batch: whole groups of `num_generations` completions."""
        return self.generation_batch_size // self.num_generations

    @property
    def micro_steps_per_batch(self) -> int:
        """The micro-steps that train on one generation batch, from its generation to the next one's."""
        return self.steps_per_generation * self.num_iterations

    @property
    def off_policy(self) -> bool:
        """Whether the policy may move between a batch's generation and its last pass: then it needs old log-probs."""
        return self.accumulation % self.micro_steps_per_batch != 0

    @property
    def prompts_per_step(self) -> float:
        """Prompts of every process consumed per optimizer step (TRL's epoch arithmetic, for rewards' clock)."""
        return self.prompts_per_generation * self.num_processes * self.accumulation / self.micro_steps_per_batch

    def generation_due(self, micro_step: int) -> bool:
        """Whether the micro-step `micro_step` starts a new generation batch."""
        return micro_step % self.micro_steps_per_batch == 0

    def steps_in_epochs(self, epochs: float, num_prompts: int) -> int:
        """TRL's `max_steps=-1`: the optimizer steps that `epochs` passes over `num_prompts` prompts take, an epoch
        being the whole generation batches the dataset fills."""
        prompts_per_generation = self.prompts_per_generation * self.num_processes
        micro_batches = num_prompts // prompts_per_generation * self.micro_steps_per_batch
        steps_per_epoch = max(micro_batches // self.accumulation, 1)
        steps = math.ceil(epochs * steps_per_epoch)
        log.info(
            "trainer.max_steps=-1: %g epochs of %d prompts (%d optimizer steps each) make %d steps",
            epochs,
            num_prompts,
            steps_per_epoch,
            steps,
        )
        return steps

    def describe(self) -> str:
        """The plan in one line, as a run logs it when it starts."""
        processes = f" on each of {self.num_processes} processes" if self.num_processes > 1 else ""
        return (
            f"Batches: {self.prompts_per_generation} prompts x {self.num_generations} completions per generation "
            f"batch{processes}, cut into {self.steps_per_generation} micro-batches of "
            f"{self.completions_per_micro_batch}, each trained on {self.num_iterations} time(s); "
            f"{self.accumulation} micro-batch(es) per optimizer step, {self.max_steps} steps"
            + (", old log-probs computed (the policy moves within a generation batch)" if self.off_policy else "")
        )


def steps_per_generation(cfg: DictConfig, num_processes: int) -> int:
    """The micro-batches of a generation batch: algorithm.steps_per_generation, or generation.batch_size (the
    completions of every process together) over the micro-batches of all processes, as TRL derives them from
    generation_batch_size and with its checks; neither: one optimizer step's worth."""
    t, algo, batch_size = cfg.trainer, cfg.algorithm, cfg.generation.batch_size
    if batch_size is None:
        return algo.steps_per_generation or t.gradient_accumulation_steps
    if algo.steps_per_generation is not None:
        raise ConfigError(
            f"generation.batch_size={batch_size} and algorithm.steps_per_generation={algo.steps_per_generation} "
            "both set the size of a generation batch: give one of them (as TRL refuses generation_batch_size with "
            "steps_per_generation)."
        )
    micro_batches = t.per_device_train_batch_size * num_processes  # one micro-batch on every process
    if batch_size < 1 or batch_size % micro_batches:
        raise ConfigError(
            f"generation.batch_size={batch_size} must be a positive multiple of trainer.per_device_train_batch_size="
            f"{t.per_device_train_batch_size} x {num_processes} process(es) = {micro_batches}: every process cuts its "
            "share into whole micro-batches (algorithm.steps_per_generation = generation.batch_size / "
            f"{micro_batches})."
        )
    if batch_size % cfg.generation.num_generations:
        raise ConfigError(
            f"generation.batch_size={batch_size} is not a multiple of generation.num_generations="
            f"{cfg.generation.num_generations}: a generation batch holds whole groups of completions."
        )
    return batch_size // micro_batches
