"""Frozen rollouts: save every scored generation batch of a run, and train another run on exactly those batches.

A sweep over losses, importance-sampling levels or corrections with `rollout_files.replay=DIR` compares them on
identical prompts, completions, sampler log-probs and rewards, so the differences it shows are the objective's
alone. (Replayed completions were sampled from the recorded run's policy, so after the first step they are
off-policy for the replaying run: that is what a paired comparison on frozen data means.)
"""

import pickle
from dataclasses import asdict
from pathlib import Path

import torch

from grpo_kit.contract.errors import InputFileError
from grpo_kit.contract.kinds import Completions
from grpo_kit.contract.pipeline import ScoredBatch

ROLLOUTS_FOLDER = "rollouts"


class RolloutRecorder:
    """Writes RUN_DIR/rollouts/000001.pt, 000002.pt, ... one file per generation batch."""

    def __init__(self, run_dir: Path):
        self.directory = Path(run_dir) / ROLLOUTS_FOLDER
        self.directory.mkdir(parents=True, exist_ok=True)
        self.count = 0

    def save(self, scored: ScoredBatch, advantages: torch.Tensor) -> None:
        self.count += 1
        record = {
            "rows": scored.rows,
            "prompt_ids": scored.prompt_ids,
            "completions": scored.completions,
            "completion_ids": scored.completion_ids,
            "generated": asdict(scored.generated),
            "rewards_per_func": scored.rewards_per_func,
            "rewards": scored.rewards,
            "num_generations": scored.num_generations,
            "metrics": scored.metrics,
            "advantages": advantages,
        }
        torch.save(record, self.directory / f"{self.count:06d}.pt")


class RolloutReplay:
    """Hands back the scored batches a recorded run saved, in order."""

    def __init__(self, run_dir: str | Path, num_generations: int, batch_size: int):
        self.directory = Path(run_dir) / ROLLOUTS_FOLDER
        self.files = sorted(self.directory.glob("*.pt"))
        if not self.files:
            raise FileNotFoundError(
                f"rollout_files.replay={run_dir} holds no saved rollouts ({self.directory}/*.pt): record them first "
                "with a run that sets rollout_files.save=true."
            )
        first = self._load(0)
        if first.num_generations != num_generations or len(first.rows) != batch_size:
            raise ValueError(
                f"The rollouts in {run_dir} hold {len(first.rows)} completions of {first.num_generations} per prompt; "
                f"this run needs {batch_size} of {num_generations}: use the recorded run's batch settings."
            )
        self.count = 0

    def next(self) -> ScoredBatch:
        if self.count == len(self.files):
            raise RuntimeError(
                f"rollout_files.replay has {len(self.files)} generation batches and this run needs more: lower "
                "trainer.max_steps (or algorithm.num_iterations x steps_per_generation) to fit them."
            )
        self.count += 1
        return self._load(self.count - 1)

    def _load(self, index: int) -> ScoredBatch:
        try:  # tensors and plain data only: unpickling anything else could run the file's code
            record = torch.load(self.files[index], weights_only=True)
        except pickle.UnpicklingError as error:
            raise InputFileError(
                f"{self.files[index]} holds more than tensors and plain data, so it was not loaded (loading it could "
                f"run code it carries): replay only rollouts a grpo_kit run saved. torch says: {error}"
            ) from None
        record.pop("advantages")
        record["generated"] = Completions(**record["generated"])
        return ScoredBatch(**record)
