"""What pipeline hooks see: the run being trained, and a scored generation batch they may filter or resample."""

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from grpo_kit.advantages import nanstd
from grpo_kit.kinds import Completions


@dataclass
class Run:
    cfg: DictConfig
    directory: Path
    accelerator: Any
    model: torch.nn.Module
    tokenizer: Any
    max_steps: int
    start_step: int = 0  # the step a resumed run starts after


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
        g = self.generated
        generated = Completions(
            g.completion_ids[items],
            g.completion_mask[items],
            g.is_truncated[items],
            None if g.sampling_per_token_logps is None else g.sampling_per_token_logps[items],
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
        )

    def concat(self, other: "ScoredBatch") -> "ScoredBatch":
        """This batch's groups, then `other`'s; completion tensors are right-padded to the longer of the two."""
        length = max(self.generated.completion_ids.shape[1], other.generated.completion_ids.shape[1])
        a, b = self.generated, other.generated

        def joined(x, y, padding):
            if x is None or y is None:
                return None
            pad = lambda t: torch.nn.functional.pad(t, (0, length - t.shape[1]), value=padding)  # noqa: E731
            return torch.cat([pad(x), pad(y)])

        generated = Completions(
            joined(a.completion_ids, b.completion_ids, 0),  # any id will do under a zero mask
            joined(a.completion_mask, b.completion_mask, 0),
            torch.cat([a.is_truncated, b.is_truncated]),
            joined(a.sampling_per_token_logps, b.sampling_per_token_logps, 0.0),
        )
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
        )
