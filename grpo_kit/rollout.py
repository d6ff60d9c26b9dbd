"""One generation batch: generate -> reward -> advantages -> the tensors the objective trains on."""

from dataclasses import dataclass

import torch

from grpo_kit.advantages import nanstd, weighted_rewards
from grpo_kit.data import is_conversational, prompt_text
from grpo_kit.kinds import Advantage, Generation
from grpo_kit.scoring import score


@dataclass
class Rollout:
    generation: Generation
    rewards: dict  # name -> reward function
    reward_weights: torch.Tensor  # (K,)
    advantage: Advantage
    tokenizer: object
    num_generations: int
    mask_truncated_completions: bool

    def __call__(self, rows: list[dict], with_logprobs: bool = False) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        """Completions for each of `rows`' prompts, scored: the generation batch and its metrics.

        `with_logprobs` asks the generation backend for the sampler's own log-probs (for a rollout correction).
        """
        rows = [row for row in rows for _ in range(self.num_generations)]  # each group's members are adjacent
        prompts = [row["prompt"] for row in rows]
        prompt_ids = [self.tokenizer(prompt_text(self.tokenizer, p), add_special_tokens=False).input_ids for p in prompts]
        out = self.generation.generate(prompt_ids, with_logprobs=with_logprobs)
        completion_mask = out.completion_mask
        if self.mask_truncated_completions:  # DAPO: a cut-off answer is neither rewarded nor punished
            completion_mask = completion_mask * ~out.is_truncated.unsqueeze(1)

        completion_ids = [ids[mask.bool()].tolist() for ids, mask in zip(out.completion_ids, out.completion_mask)]
        texts = self.tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
        completions = [
            [{"role": "assistant", "content": text}] if is_conversational(prompt) else text
            for prompt, text in zip(prompts, texts)
        ]
        columns = {key: [row[key] for row in rows] for key in rows[0] if key != "prompt"}
        rewards_per_func = score(self.rewards, prompts, completions, completion_ids, columns)  # (N, K)
        advantages = self.advantage(rewards_per_func, self.reward_weights, self.num_generations)  # (N,)

        padded = self.tokenizer.pad({"input_ids": prompt_ids}, padding_side="left", return_tensors="pt")
        batch = {
            "prompt_ids": padded["input_ids"],  # (N, P)
            "prompt_mask": padded["attention_mask"],  # (N, P)
            "completion_ids": out.completion_ids,  # (N, T)
            "completion_mask": completion_mask,  # (N, T)
            "advantages": advantages,  # (N,)
        }
        if out.sampling_per_token_logps is not None:
            batch["sampling_per_token_logps"] = out.sampling_per_token_logps
        return batch, self._metrics(rewards_per_func, out)

    def _metrics(self, rewards_per_func, out) -> dict[str, float]:
        rewards = weighted_rewards(rewards_per_func, self.reward_weights)  # (N,), NaN where unscorable
        group_std = nanstd(rewards.view(-1, self.num_generations), dim=1)
        lengths = out.completion_mask.sum(dim=1).float()
        metrics = {
            "reward": rewards.nanmean().item(),
            "reward_std": nanstd(rewards).item(),
            "frac_reward_zero_std": (group_std.nan_to_num(0.0) < 1e-6).float().mean().item(),
            "completions/mean_length": lengths.mean().item(),
            "completions/max_length": lengths.max().item(),
            "completions/clipped_ratio": out.is_truncated.float().mean().item(),
        }
        for index, name in enumerate(self.rewards):
            column = rewards_per_func[:, index]
            metrics[f"rewards/{name}/mean"] = column.nanmean().item()
            metrics[f"rewards/{name}/std"] = nanstd(column).item()
        return metrics
