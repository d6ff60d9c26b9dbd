"""What a restart needs, and nothing else: a checkpoint is `TrainState.state_dict()`, and resuming is
`load_state_dict()` of it, so that a resumed run goes on bit for bit as if it had never stopped."""

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import gather_object

from grpo_kit.contract.errors import ConfigError
from grpo_kit.model.sharding import load_whole_weights, state_is_sharded
from grpo_kit.objective.objective import EntropyControl
from grpo_kit.outputs.checkpoints import random_states, restore_random_states
from grpo_kit.rollout.ahead import GenerationAhead
from grpo_kit.rollout.prompts import PromptSampler
from grpo_kit.rollout.replay import RolloutRecorder, RolloutReplay
from grpo_kit.training.batches import GenerationBatch
from grpo_kit.training.staleness import LaggedWeights


@dataclass
class TrainState:
    model: torch.nn.Module  # unwrapped
    optimizer: torch.optim.Optimizer
    scheduler: Any
    sampler: PromptSampler
    entropy_control: EntropyControl  # adaptive entropy's coefficient
    config: dict  # the resolved config, to refuse a resume under other settings
    moving_reference: torch.nn.Module | None = None  # the reference model when algorithm.sync_ref_model moves it
    replay: RolloutReplay | None = None
    recorder: RolloutRecorder | None = None
    step: int = 0  # optimizer steps done
    micro_step: int = 0  # micro-batches trained on so far
    batch: GenerationBatch | None = None  # the generation batch still being trained on
    window: defaultdict[str, list[float]] = field(default_factory=lambda: defaultdict(list))  # since the last log
    num_tokens: int = 0  # prompt and completion tokens generated for training so far, every process's
    # Asynchronous generation's worker, which draws prompts ahead: the sampler's state to save is from before the
    # batches it has drawn and the trainer has not taken, which a resume draws again (dropped_ahead of them).
    ahead: GenerationAhead | None = None
    dropped_ahead: int = 0
    lagged: LaggedWeights | None = None  # algorithm.forced_staleness's ring of older weights

    def state_dict(self, accelerator: Accelerator) -> dict:
        """The checkpoint; every process calls it, since it gathers what differs between processes."""
        sharded = state_is_sharded(accelerator)  # then accelerator.save_state writes the model and optimizer
        return {
            "model": None if sharded else self.model.state_dict(),
            "optimizer": None if sharded else self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "sampler": self._sampler_state(),
            "generated_ahead": 0 if self.ahead is None else self.ahead.in_flight(),
            "reference": (  # gathered whole under FSDP2 and ZeRO-3
                None if self.moving_reference is None else accelerator.get_state_dict(self.moving_reference)
            ),
            "replay_position": None if self.replay is None else self.replay.count,
            "recorded": None if self.recorder is None else self.recorder.count,
            "config": self.config,
            "step": self.step,
            "micro_step": self.micro_step,
            "window": dict(self.window),
            "num_tokens": self.num_tokens,
            "entropy_control": self.entropy_control.state_dict(),
            "lagged": None if self.lagged is None else self.lagged.state_dict(),
            # Each process's own generation batch and random generators, by process index.
            "processes": gather_object(
                [{"batch": None if self.batch is None else self.batch.state_dict(), "random": random_states()}]
            ),
        }

    def load_state_dict(self, state: dict, accelerator: Accelerator) -> None:
        if len(state["processes"]) != accelerator.num_processes:
            raise ConfigError(
                f"The checkpoint was written by {len(state['processes'])} processes and this run has "
                f"{accelerator.num_processes}: resume with as many processes, for the run to go on exactly."
            )
        own = state["processes"][accelerator.process_index]
        if state["model"] is not None:  # otherwise accelerator.load_state has loaded them
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.sampler.restore(state["sampler"])
        self.dropped_ahead = state.get("generated_ahead", 0)  # absent from checkpoints older than max_staleness
        if self.moving_reference is not None:
            load_whole_weights(accelerator, self.moving_reference, state["reference"])
        if self.replay is not None:
            self.replay.count = state["replay_position"]
        if self.recorder is not None:
            self.recorder.count = state["recorded"]
        self.step, self.micro_step, self.num_tokens = state["step"], state["micro_step"], state["num_tokens"]
        self.batch = None if own["batch"] is None else GenerationBatch.from_state_dict(own["batch"], accelerator.device)
        self.window.clear()
        self.window.update(state["window"])
        self.entropy_control.load_state_dict(state["entropy_control"])
        if self.lagged is not None:  # a checkpoint without it has another config, which the resume refused
            self.lagged.load_state_dict(state["lagged"])
        restore_random_states(own["random"])

    def progress(self) -> dict:
        """What a step changes before its optimizer step, to go back to the step's start (`rewind`)."""
        return {
            "sampler": self._sampler_state(),
            "micro_step": self.micro_step,
            "batch": None if self.batch is None else self.batch.copy(),
            "window": {name: list(values) for name, values in self.window.items()},
            "num_tokens": self.num_tokens,
            "replay_position": None if self.replay is None else self.replay.count,
            "recorded": None if self.recorder is None else self.recorder.count,
            "random": random_states(),
        }

    def _sampler_state(self) -> dict:
        return self.sampler.state() if self.ahead is None else self.ahead.sampler_state()

    def rewind(self, progress: dict) -> None:
        self.sampler.restore(progress["sampler"])
        self.micro_step, self.batch, self.num_tokens = progress["micro_step"], progress["batch"], progress["num_tokens"]
        self.window.clear()
        self.window.update(progress["window"])
        if self.replay is not None:
            self.replay.count = progress["replay_position"]
        if self.recorder is not None:
            self.recorder.count = progress["recorded"]
        restore_random_states(progress["random"])
