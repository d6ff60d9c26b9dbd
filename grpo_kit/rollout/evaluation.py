"""Evaluation: held-out prompts, generated for and scored like training prompts; metrics under `eval/`.

An evaluation draws its samples from a random generator of its own, seeded by the run's seed and the step, so a
run with evaluation trains exactly like the same run without it, and a resumed run evaluates like the original.
A signal (SIGINT, SIGTERM) ends an evaluation between two batches, unlogged, so that the run saves and stops at once.
"""

import logging
from collections.abc import Callable
from pathlib import Path

import datasets
import torch
from accelerate.utils import gather_object

from grpo_kit.config.compose import DataConfig, EvalConfig
from grpo_kit.contract.advantages import nanstd
from grpo_kit.embedded import sums as embedded
from grpo_kit.rollout.prompts import load_prompts
from grpo_kit.rollout.rollout import Rollout

log = logging.getLogger(__name__)


def load_eval_prompts(cfg: EvalConfig, data: DataConfig) -> datasets.Dataset | None:
    """The first `cfg.num_examples` rows of the eval set, or None when no eval set is named."""
    if cfg.path is None and cfg.split is None:
        return None
    if cfg.path is None and data.path is None:
        dataset = datasets.Dataset.from_list(embedded.eval_problems(data.embedded, cfg.split))
    elif cfg.path is None and Path(data.path).suffix:
        raise ValueError(
            f"eval.split={cfg.split} picks a split of a hub dataset, but data.path={data.path} is a file: "
            "name the eval file with eval.path=FILE instead."
        )
    else:
        source = DataConfig(
            path=cfg.path or data.path, name=None if cfg.path else data.name, split=cfg.split or "train"
        )
        dataset = load_prompts(source, setting="eval.path" if cfg.path else "data.path")
    return dataset.select(range(min(cfg.num_examples, len(dataset))))


class Evaluator:
    """`evaluator(step)` -> the eval/ metrics of the policy as it is, on this process's share of the eval set; none
    when `stopping()` turns true before the last batch."""

    def __init__(
        self,
        prompts: datasets.Dataset,
        rollout: Rollout,
        cfg: EvalConfig,
        seed: int,
        last_step: int,
        accelerator,
        stopping: Callable[[], bool] = lambda: False,
    ):
        self.rollout, self.seed, self.last_step, self.accelerator = rollout, seed, last_step, accelerator
        self.stopping = stopping
        self.steps, self.batch_size = cfg.steps, cfg.batch_size
        self.num_generations = cfg.num_generations or rollout.num_generations
        shard = range(accelerator.process_index, len(prompts), accelerator.num_processes)
        self.rows = [prompts[index] for index in shard]

    def due(self, step: int) -> bool:
        return step == self.last_step or (self.steps > 0 and step % self.steps == 0)

    @torch.no_grad()
    def __call__(self, step: int) -> dict[str, float]:
        devices = [self.accelerator.device] if self.accelerator.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(self.seed + step)
            batches = []
            for start in range(0, len(self.rows), self.batch_size):
                if self.stopping():
                    log.warning("The evaluation of step %d is abandoned: the run is stopping", step)
                    return {}
                batches.append(self.rollout.score(self.rows[start : start + self.batch_size], self.num_generations))
        local = torch.cat(
            [
                torch.cat(
                    [
                        scored.rewards.unsqueeze(1),
                        scored.rewards_per_func,
                        scored.generated.completion_mask.sum(dim=1, keepdim=True).float(),
                        scored.generated.is_truncated.float().unsqueeze(1),
                    ],
                    dim=1,
                )
                for scored in batches
            ]
        )  # (n, 1 + K + 2) this process's completions
        columns = torch.tensor(gather_object(local.tolist()))  # (N, 1 + K + 2) every process's
        rewards, per_func, lengths, truncated = columns[:, 0], columns[:, 1:-2], columns[:, -2], columns[:, -1]
        metrics = {
            "eval/reward": rewards.nanmean().item(),
            "eval/reward_std": nanstd(rewards).item(),
            "eval/completions/mean_length": lengths.mean().item(),
            "eval/completions/clipped_ratio": truncated.mean().item(),
        }
        for index, name in enumerate(self.rollout.scorer.rewards):
            metrics[f"eval/rewards/{name}/mean"] = per_func[:, index].nanmean().item()
        return metrics
