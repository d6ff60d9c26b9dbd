"""One generation batch: draw prompts -> generate -> score -> (hooks) -> advantages -> the tensors to train on."""

from dataclasses import dataclass

import torch

from grpo_kit.advantages import nanstd, weighted_rewards
from grpo_kit.data import PromptSampler, is_conversational, prompt_text
from grpo_kit.kinds import Generation
from grpo_kit.pipeline import Run, ScoredBatch
from grpo_kit.replay import RolloutRecorder, RolloutReplay
from grpo_kit.scoring import Scorer


@dataclass
class Rollout:
    sampler: PromptSampler
    generation: Generation
    scorer: Scorer
    reward_weights: torch.Tensor  # (K,)
    advantage: object  # (rewards_per_func, weights, num_generations) -> (N,)
    tokenizer: object
    num_generations: int
    mask_truncated_completions: bool
    hooks: object  # the plugin manager's hook caller
    with_logprobs: bool = False  # ask the backend for the sampler's log-probs (for a rollout correction)
    replay: RolloutReplay | None = None  # frozen rollouts to train on instead of generating
    recorder: RolloutRecorder | None = None  # saves every scored batch

    def __call__(self, run: Run, num_prompts: int) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        """The next generation batch of `num_prompts` prompts: tensors for the objective, and its metrics."""
        if self.replay is not None:
            scored = self.replay.next()
        else:
            scored = self._scored_and_filtered(run, num_prompts)
        advantages = self.advantage(scored.rewards_per_func, self.reward_weights, self.num_generations)  # (N,)
        advantages = self.hooks.on_advantages(run=run, scored=scored, advantages=advantages) or advantages
        if self.recorder is not None:
            self.recorder.save(scored, advantages)
        self.last = (scored, advantages)  # for the sample log
        return self._tensors(scored, advantages), self._metrics(scored)

    def _scored_and_filtered(self, run: Run, num_prompts: int) -> ScoredBatch:
        scored = self.score(self.sampler.draw(num_prompts))
        replaced = self.hooks.on_rollout_scored(run=run, scored=scored, draw=lambda n: self.score(self.sampler.draw(n)))
        if replaced is None:
            return scored
        if replaced.num_groups != scored.num_groups:
            raise RuntimeError(
                f"An on_rollout_scored hook returned {replaced.num_groups} groups for a batch of "
                f"{scored.num_groups}: a hook must keep the batch size."
            )
        return replaced

    def score(self, rows: list[dict], num_generations: int | None = None) -> ScoredBatch:
        """Generate `num_generations` (by default the run's) completions for each row's prompt and score them."""
        num_generations = num_generations or self.num_generations
        rows = [row for row in rows for _ in range(num_generations)]  # each group's members are adjacent
        prompts = [row["prompt"] for row in rows]
        prompt_ids = [self.tokenizer(prompt_text(self.tokenizer, p), add_special_tokens=False).input_ids for p in prompts]
        generated = self.generation.generate(prompt_ids, with_logprobs=self.with_logprobs)
        completion_ids = [ids[mask.bool()].tolist() for ids, mask in zip(generated.completion_ids, generated.completion_mask)]
        texts = self.tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
        completions = [
            [{"role": "assistant", "content": text}] if is_conversational(prompt) else text
            for prompt, text in zip(prompts, texts)
        ]
        columns = {key: [row[key] for row in rows] for key in rows[0] if key != "prompt"}
        rewards_per_func, metrics = self.scorer(prompts, completions, completion_ids, columns)  # (N, K)
        return ScoredBatch(
            rows=rows,
            prompt_ids=prompt_ids,
            completions=completions,
            completion_ids=completion_ids,
            generated=generated,
            rewards_per_func=rewards_per_func,
            rewards=weighted_rewards(rewards_per_func, self.reward_weights),
            num_generations=num_generations,
            metrics=metrics,
        )

    def _tensors(self, scored: ScoredBatch, advantages: torch.Tensor) -> dict[str, torch.Tensor]:
        generated = scored.generated
        completion_mask = generated.completion_mask
        if self.mask_truncated_completions:  # DAPO: a cut-off answer is neither rewarded nor punished
            completion_mask = completion_mask * ~generated.is_truncated.unsqueeze(1)
        padded = self.tokenizer.pad({"input_ids": scored.prompt_ids}, padding_side="left", return_tensors="pt")
        batch = {
            "prompt_ids": padded["input_ids"],  # (N, P)
            "prompt_mask": padded["attention_mask"],  # (N, P)
            "completion_ids": generated.completion_ids,  # (N, T)
            "completion_mask": completion_mask,  # (N, T)
            "advantages": advantages,  # (N,)
        }
        if generated.sampling_per_token_logps is not None:
            batch["sampling_per_token_logps"] = generated.sampling_per_token_logps
        return batch

    def _metrics(self, scored: ScoredBatch) -> dict[str, float]:
        lengths = scored.generated.completion_mask.sum(dim=1).float()
        metrics = {
            "reward": scored.rewards.nanmean().item(),
            "reward_std": nanstd(scored.rewards).item(),
            "frac_reward_zero_std": (scored.group_std() < 1e-6).float().mean().item(),
            "completions/mean_length": lengths.mean().item(),
            "completions/max_length": lengths.max().item(),
            "completions/clipped_ratio": scored.generated.is_truncated.float().mean().item(),
            **scored.metrics,
        }
        for index, name in enumerate(self.scorer.rewards):
            column = scored.rewards_per_func[:, index]
            metrics[f"rewards/{name}/mean"] = column.nanmean().item()
            metrics[f"rewards/{name}/std"] = nanstd(column).item()
        return metrics
