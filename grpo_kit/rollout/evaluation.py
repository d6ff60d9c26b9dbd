"""Evaluation: held-out prompts, generated for and scored like training prompts; metrics under `eval/`, and
`eval/NAME/` for each named set (eval.sets.NAME). With eval.num_samples, pass@k and maj@k too (sampled_metrics.py).

An evaluation draws its samples from a random generator of its own, seeded by the run's seed and the step (and a
named set's name), so a run with evaluation trains exactly like the same run without it, and a resumed run
evaluates like the original.
A signal (SIGINT, SIGTERM) ends an evaluation between two batches, unlogged, so that the run saves and stops at once.
"""

import logging
import re
import zlib
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import datasets
import torch
from accelerate.utils import gather_object

from grpo_kit.config.schema import DataConfig, EvalConfig, EvalSetConfig
from grpo_kit.contract.advantages import nanstd
from grpo_kit.contract.errors import ConfigError
from grpo_kit.contract.kinds import declared
from grpo_kit.embedded import sums as embedded
from grpo_kit.rollout.prompts import load_prompts
from grpo_kit.rollout.rollout import Rollout
from grpo_kit.rollout.sampled_metrics import extracted_answer, sampled_metrics

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


def load_eval_sets(cfg: EvalConfig, data: DataConfig) -> dict[str | None, datasets.Dataset]:
    """Every eval set by name: None for the held-out set of eval.path / eval.split, when one is named, then the
    named sets of eval.sets."""
    sets = {}
    held_out = load_eval_prompts(cfg, data)
    if held_out is not None:
        sets[None] = held_out
    for name, options in cfg.sets.items():
        eval_set = EvalSetConfig(**options)
        source = DataConfig(path=eval_set.path, split=eval_set.split or "train")
        dataset = load_prompts(source, setting=f"eval.sets.{name}.path")
        sets[name] = dataset.select(range(min(eval_set.num_examples or cfg.num_examples, len(dataset))))
    return sets


class Evaluator:
    """`evaluator(step)` -> the eval/ metrics of the policy as it is, on this process's share of each eval set; none
    when `stopping()` turns true before the last batch."""

    def __init__(
        self,
        sets: dict[str | None, datasets.Dataset],
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
        self.num_samples = cfg.num_samples
        self.num_generations = cfg.num_samples or cfg.num_generations or rollout.num_generations
        self.pass_at = sorted(set(cfg.pass_at or [1, self.num_generations]))
        self.correct_threshold = cfg.correct_threshold
        self.answer_pattern = None if cfg.answer_pattern is None else re.compile(cfg.answer_pattern)
        self.sampling = self._sampling(cfg.temperature, cfg.top_p)
        first, every = accelerator.process_index, accelerator.num_processes
        self.rows = {  # this process's share of each set
            name: [prompts[index] for index in range(first, len(prompts), every)] for name, prompts in sets.items()
        }

    def _sampling(self, temperature: float | None, top_p: float | None) -> Callable:
        """A context for evaluation's generate calls: eval.temperature and eval.top_p, where given."""
        if temperature is None and top_p is None:
            return nullcontext
        sampling = declared(self.rollout.generation, "generation", "sampling")
        if sampling(temperature, top_p) is None:
            raise ConfigError(
                "eval.temperature and eval.top_p ask for sampling settings of evaluation's own, but this run's "
                "generation backend samples only with the run's (generation.temperature, generation.top_p): drop "
                "them, or evaluate with a backend that implements `sampling`."
            )
        return lambda: sampling(temperature, top_p)

    def due(self, step: int) -> bool:
        return step == self.last_step or (self.steps > 0 and step % self.steps == 0)

    @torch.no_grad()
    def __call__(self, step: int) -> dict[str, float]:
        metrics = {}
        for name, rows in self.rows.items():
            batches = self._scored(rows, self.seed + step + (0 if name is None else zlib.crc32(name.encode())))
            if batches is None:
                log.warning("The evaluation of step %d is abandoned: the run is stopping", step)
                return {}
            metrics |= self._metrics(batches, "eval/" if name is None else f"eval/{name}/")
        return metrics

    def _scored(self, rows: list[dict], seed: int) -> list | None:
        """`rows` generated for and scored in batches, under a random generator of their own; None when the run
        stops before the last batch."""
        devices = [self.accelerator.device] if self.accelerator.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), self.sampling():
            torch.manual_seed(seed)
            batches = []
            for start in range(0, len(rows), self.batch_size):
                if self.stopping():
                    return None
                batches.append(self.rollout.score(rows[start : start + self.batch_size], self.num_generations))
        return batches

    def _metrics(self, batches: list, prefix: str) -> dict[str, float]:
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
            f"{prefix}reward": rewards.nanmean().item(),
            f"{prefix}reward_std": nanstd(rewards).item(),
            f"{prefix}completions/mean_length": lengths.mean().item(),
            f"{prefix}completions/clipped_ratio": truncated.mean().item(),
        }
        names = list(self.rollout.scorer.rewards)
        for index, name in enumerate(names):
            metrics[f"{prefix}rewards/{name}/mean"] = per_func[:, index].nanmean().item()
        if self.num_samples is not None:
            answers = [
                extracted_answer(completion, self.answer_pattern)
                for scored in batches
                for completion in scored.completions
            ]
            correct = columns[:, : 1 + len(names)] >= self.correct_threshold  # (N, 1 + K); NaN is never correct
            every_answer = gather_object(answers)  # in the order of `columns`: whole groups, process by process
            metrics |= sampled_metrics(correct, every_answer, self.num_samples, self.pass_at, names, prefix)
        return metrics
