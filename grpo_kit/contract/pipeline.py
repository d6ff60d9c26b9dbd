"""What pipeline hooks see: the run being trained, and a scored generation batch they may filter or resample."""

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from grpo_kit.contract.advantages import nanstd
from grpo_kit.contract.kinds import Completions


@dataclass
class Run:
    cfg: DictConfig
    directory: Path
    accelerator: Any
    model: torch.nn.Module
    tokenizer: Any
    max_steps: int
    start_step: int = 0  # the step a resumed run starts after
    processor: Any = None  # a vision-language policy's processor (its tokenizer is `tokenizer`); None for a text one


@dataclass
class ScoredBatch:
    """Completions of `num_groups` prompts, `num_generations` each (group members adjacent), with their rewards."""

    rows: list[dict]  # (N,) the dataset row of each completion's prompt
    prompt_ids: list[list[int]]  # (N,)
    completions: list  # (N,) text, or chat messages when the prompts are
    completion_ids: list[list[int]]  # (N,) the tokens up to and including EOS
    generated: Completions  # (N, T) tensors from the generation backend
    rewards_per_func: torch.Tensor  # (N, K), NaN where a reward had no opinion
    rewards: torch.Tensor  # (N,) weighted sum, NaN where no reward had an opinion
    num_generations: int
    metrics: dict[str, float] = field(default_factory=dict)  # from scoring, and from hooks
    extra_columns: dict[str, list] = field(default_factory=dict)  # (N,) each: what rewards logged with log_extra

    @property
    def num_groups(self) -> int:
        return len(self.rows) // self.num_generations

    @property
    def prompts(self) -> list:
        return [row["prompt"] for row in self.rows]

    def group_std(self) -> torch.Tensor:  # (num_groups,)
        return nanstd(self.rewards.view(-1, self.num_generations), dim=1).nan_to_num(0.0)

    def select_groups(self, groups: list[int] | torch.Tensor) -> "ScoredBatch":
        groups = torch.as_tensor(groups, dtype=torch.long)
        items = (groups.unsqueeze(1) * self.num_generations + torch.arange(self.num_generations)).view(-1)
        picked = items.tolist()
        generated = Completions(
            **{name: None if tensor is None else tensor[items] for name, tensor in vars(self.generated).items()}
        )
        return replace(
            self,
            rows=[self.rows[i] for i in picked],
            prompt_ids=[self.prompt_ids[i] for i in picked],
            completions=[self.completions[i] for i in picked],
            completion_ids=[self.completion_ids[i] for i in picked],
            generated=generated,
            rewards_per_func=self.rewards_per_func[items],
            rewards=self.rewards[items],
            extra_columns={name: [values[i] for i in picked] for name, values in self.extra_columns.items()},
        )

    def concat(self, other: "ScoredBatch") -> "ScoredBatch":
        """This batch's groups, then `other`'s; completion tensors are right-padded to the longer of the two."""
        length = max(self.generated.completion_ids.shape[1], other.generated.completion_ids.shape[1])
        a, b = self.generated, other.generated

        def joined(name: str) -> torch.Tensor | None:
            x, y = getattr(a, name), getattr(b, name)
            if x is None or y is None:
                return None
            if x.dim() == 2:  # (N, T): right-padded with zeros, which any zero mask makes harmless
                x, y = (torch.nn.functional.pad(t, (0, length - t.shape[1])) for t in (x, y))
            return torch.cat([x, y])

        generated = Completions(**{name: joined(name) for name in vars(a)})
        return replace(
            self,
            rows=self.rows + other.rows,
            prompt_ids=self.prompt_ids + other.prompt_ids,
            completions=self.completions + other.completions,
            completion_ids=self.completion_ids + other.completion_ids,
            generated=generated,
            rewards_per_func=torch.cat([self.rewards_per_func, other.rewards_per_func]),
            rewards=torch.cat([self.rewards, other.rewards]),
            metrics={**self.metrics},
            extra_columns={  # None where one batch's rewards did not log the column
                name: self.extra_columns.get(name, [None] * len(self.rows))
                + other.extra_columns.get(name, [None] * len(other.rows))
                for name in {**self.extra_columns, **other.extra_columns}
            },
        )
