"""One generation batch: draw prompts -> generate -> score -> (hooks) -> advantages -> the tensors to train on.

With several processes, each generates and scores whole groups of its own prompts; the rewards are gathered so
that the advantages and the logged metrics are those of the whole batch, as in TRL, and each process keeps the
advantages of its own completions.
"""

import math
from dataclasses import dataclass, replace
from typing import Any

import torch
from accelerate.utils import gather_object

from grpo_kit.contract.advantages import nanstd, weighted_rewards
from grpo_kit.contract.eos import is_truncated
from grpo_kit.contract.errors import PluginError
from grpo_kit.contract.kinds import Completions, CustomRollout, Generation, RolloutResult
from grpo_kit.contract.micro_batch import MicroBatch
from grpo_kit.contract.pipeline import Run, ScoredBatch
from grpo_kit.plugins.chaining import chain
from grpo_kit.rollout.ahead import Generated, GenerationAhead
from grpo_kit.rollout.images import ImagePrompts
from grpo_kit.rollout.prompts import PromptSampler, is_conversational, prompt_text
from grpo_kit.rollout.replay import RolloutRecorder, RolloutReplay
from grpo_kit.rollout.scoring import Scorer, checked_weighted_rewards
from grpo_kit.rollout.tool_use import ToolUse


@dataclass
class RolloutBatch:
    """A generation batch of this process as the rollout leaves it."""

    scored: ScoredBatch
    advantages: torch.Tensor  # (N,)
    training_rows: MicroBatch  # what the objective reads: prompt and completion ids and masks, advantages, ...
    metrics: dict[str, float]  # of the whole batch, every process's
    weight_version: int  # the optimizer steps of the weights that sampled it


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
    accelerator: Any  # gathers across processes
    eos_token_ids: list[
        int
    ]  # every token that ends a completion (grpo_kit.contract.eos: the model's and the tokenizer's)
    with_logprobs: bool = False  # ask the backend for the sampler's log-probs (for a rollout correction)
    replay: RolloutReplay | None = None  # frozen rollouts to train on instead of generating
    recorder: RolloutRecorder | None = None  # saves every scored batch
    tool_use: ToolUse | None = None  # multi-turn generation with tools (+environment=NAME, tools=[...])
    custom: CustomRollout | None = None  # a rollout plugin's generation instead (+rollout=NAME)
    images: ImagePrompts | None = None  # a vision-language policy's processor, for prompts with images

    @property
    def ahead(self) -> GenerationAhead | None:
        """Asynchronous generation: the backend with a worker that generates batches while the trainer trains."""
        return self.generation if isinstance(self.generation, GenerationAhead) else None

    def __call__(self, run: Run, num_prompts: int, version: int) -> "RolloutBatch":
        """This process's next `num_prompts` prompts, generated, scored and given their advantages; `version`: the
        optimizer steps of the weights now."""
        sampled_with = version
        if self.replay is not None:
            scored = self.replay.next()
        elif self.ahead is not None:  # generated in the background, with the weights of `sampled_with` steps
            generated = self.ahead.take()
            sampled_with = generated.weight_version
            scored = versioned(self._score_generated(generated, self.num_generations), sampled_with)
            # A hook's redraw is generated now, on this thread, by the weights of `version` steps: its rows keep
            # that version, for the staleness each micro-step trains at (training/staleness_metrics.py).
            scored = self._filtered(run, scored, lambda num_prompts: versioned(self._draw(num_prompts), version))
        else:
            indices, rows = self.sampler.draw_indexed(num_prompts)
            scored = self.score(rows)
            self._observe(indices, scored)  # the groups as scored, before a hook filters them
            scored = self._filtered(run, scored)
        every_reward = self._gather(scored.rewards_per_func)  # (N x processes, K), in process order
        first = self.accelerator.process_index * len(scored.rows)
        advantages = self.advantage(every_reward, self.reward_weights, self.num_generations)  # (N x processes,)
        advantages = advantages[first : first + len(scored.rows)]  # (N,) this process's
        advantages = chain(
            self.hooks.on_advantages, "advantages", _same_shape, run=run, scored=scored, advantages=advantages
        )
        if self.recorder is not None:
            self.recorder.save(scored, advantages)
        metrics = self._metrics(scored, every_reward) | (self.ahead.last_taken if self.ahead is not None else {})
        metrics |= self.sampler.metrics()
        return RolloutBatch(scored, advantages, self._training_rows(scored, advantages), metrics, sampled_with)

    def _observe(self, indices: list[int], scored: ScoredBatch) -> None:
        """Tell the sampler every process's groups: their prompts and rewards. A hook's redraws are not told, since
        each process redraws on its own and the samplers of all processes must be told alike."""
        every_index = self._gather(torch.tensor(indices, dtype=torch.long)).tolist()  # (G x processes,)
        every_reward = self._gather(scored.rewards).view(len(every_index), -1)  # (G x processes, num_generations)
        self.sampler.observe(every_index, every_reward)

    def _filtered(self, run: Run, scored: ScoredBatch, draw=None) -> ScoredBatch:
        """What the hooks keep of a scored batch (DAPO's dynamic sampling draws more here, generating in this
        thread)."""
        draw = draw or self._draw
        return chain(self.hooks.on_rollout_scored, "scored", _same_groups, run=run, scored=scored, draw=draw)

    def _draw(self, num_prompts: int) -> ScoredBatch:
        # Under asynchronous generation the worker draws from the same sampler: a redraw takes the worker's lock.
        rows = self.sampler.draw(num_prompts) if self.ahead is None else self.ahead.draw(num_prompts)
        return self.score(rows)

    def score(self, rows: list[dict], num_generations: int | None = None) -> ScoredBatch:
        """Generate `num_generations` (by default the run's) completions for each row's prompt and score them."""
        num_generations = num_generations or self.num_generations
        return self._score_generated(self.generate_rows(rows, num_generations), num_generations)

    def generate_rows(self, rows: list[dict], num_generations: int | None = None, generate=None) -> Generated:
        """`num_generations` completions for each row's prompt, each group's members adjacent; `generate`: the
        backend's call to use (asynchronous generation's worker passes `generate_in_background`)."""
        rows = [row for row in rows for _ in range(num_generations or self.num_generations)]
        return Generated(rows, *self._generate(rows, generate or self.generation.generate))

    def _score_generated(self, batch: Generated, num_generations: int) -> ScoredBatch:
        rows, generated, completions = batch.rows, batch.generated, batch.completions
        lengths = generated.completion_mask.sum(dim=1).tolist()  # the mask is a prefix of each row
        completion_ids = [ids[:length] for ids, length in zip(generated.completion_ids.tolist(), lengths)]
        columns = {key: [row[key] for row in rows] for key in rows[0] if key != "prompt"} | batch.extra_columns
        scores = self.scorer.score([row["prompt"] for row in rows], completions, completion_ids, columns)
        return ScoredBatch(
            rows=rows,
            prompt_ids=batch.prompt_ids,
            completions=completions,
            completion_ids=completion_ids,
            generated=generated,
            rewards_per_func=scores.rewards,  # (N, K)
            rewards=checked_weighted_rewards(scores.rewards, self.reward_weights),
            num_generations=num_generations,
            metrics=scores.metrics,
            extra_columns=scores.extra_columns,
        )

    def _generate(self, rows: list[dict], generate) -> tuple[list[list[int]], list, Completions, dict[str, list]]:
        """Prompt ids, the completions as the rewards read them, their tensors, and extra reward columns."""
        if self.custom is not None:
            result = self.custom(rows, self.tokenizer, self.generation)
            generated = completions_of(result, self.tokenizer, self.eos_token_ids, self.with_logprobs)
            completions = result.completions or self._decoded(rows, generated)
            return result.prompt_ids, completions, generated, result.columns
        if self.tool_use is not None:
            turns = self.tool_use(rows, self.with_logprobs)
            # As TRL does, every reward may read the completions' environments, as their episodes left them.
            columns = {"environments": self.tool_use.environments[: len(rows)]} if self.tool_use.environment else {}
            return turns.prompt_ids, turns.completions, turns.generated, columns
        if self.images is not None:  # a vision-language policy: its processor renders the prompts with their images
            prompt_ids, images = self.images.encode(rows)
            with_images = {"images": images} if images is not None else {}
            generated = generate(prompt_ids, with_logprobs=self.with_logprobs, **with_images)
            generated = self.images.cut_at_placeholders(generated, self.tokenizer.pad_token_id)
            return prompt_ids, self._decoded(rows, generated), generated, {}
        prompt_texts = [prompt_text(self.tokenizer, row["prompt"]) for row in rows]
        prompt_ids = self.tokenizer(prompt_texts, add_special_tokens=False).input_ids  # one call for the batch
        generated = generate(prompt_ids, with_logprobs=self.with_logprobs)
        return prompt_ids, self._decoded(rows, generated), generated, {}

    def _decoded(self, rows: list[dict], generated: Completions) -> list:
        """Each completion's text, as an assistant message where the prompt is chat messages."""
        lengths = generated.completion_mask.sum(dim=1).tolist()
        ids = [row[:length] for row, length in zip(generated.completion_ids.tolist(), lengths)]
        texts = self.tokenizer.batch_decode(ids, skip_special_tokens=True)
        return [
            [{"role": "assistant", "content": text}] if is_conversational(row["prompt"]) else text
            for row, text in zip(rows, texts)
        ]

    def _training_rows(self, scored: ScoredBatch, advantages: torch.Tensor) -> MicroBatch:
        generated = scored.generated
        completion_mask = generated.completion_mask
        if self.mask_truncated_completions:  # DAPO: a cut-off answer is neither rewarded nor punished
            completion_mask = completion_mask * ~generated.is_truncated.unsqueeze(1)
        padded = self.tokenizer.pad({"input_ids": scored.prompt_ids}, padding_side="left", return_tensors="pt")
        images = self.images.row_tensors(scored.rows) if self.images is not None else {}
        return MicroBatch(
            prompt_ids=padded["input_ids"],  # (N, P)
            prompt_mask=padded["attention_mask"],  # (N, P)
            completion_ids=generated.completion_ids,  # (N, T)
            completion_mask=completion_mask,  # (N, T)
            advantages=advantages,  # (N,)
            rewards=scored.rewards,  # (N,)
            tool_mask=generated.tool_mask,  # (N, T) or None
            sampling_per_token_logps=generated.sampling_per_token_logps,  # (N, T) or None
            weight_versions=generated.weight_versions,  # (N,) or None: every row the batch's version
            **images,  # pixel_values (N, P, C), image_grid_thw (N, I, 3), for prompts with images
        )

    def _gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every process's `tensor` concatenated along dim 0, on the CPU (NCCL gathers CUDA tensors only)."""
        return self.accelerator.gather(tensor.to(self.accelerator.device)).cpu()

    def _metrics(self, scored: ScoredBatch, rewards_per_func: torch.Tensor) -> dict[str, float]:
        """The batch's metrics over every process: `rewards_per_func` (N x processes, K) is already gathered."""
        gather = self._gather
        rewards = weighted_rewards(rewards_per_func, self.reward_weights)  # (N x processes,)
        group_std = nanstd(rewards.view(-1, self.num_generations), dim=1).nan_to_num(0.0)
        generated = scored.generated
        lengths = gather(generated.written_mask().sum(dim=1).float())  # the tokens the model wrote, as TRL counts them
        metrics = {
            "reward": rewards.nanmean().item(),
            "reward_std": nanstd(rewards).item(),
            "frac_reward_zero_std": (group_std < 1e-6).float().mean().item(),
            "completions/mean_length": lengths.mean().item(),
            "completions/max_length": lengths.max().item(),
            "completions/clipped_ratio": gather(scored.generated.is_truncated.float()).mean().item(),
        }
        if generated.tool_calls is not None:
            calls, failures = gather(generated.tool_calls.float()), gather(generated.tool_failures.float())
            metrics["tools/call_frequency"] = calls.mean().item()  # calls per completion
            metrics["tools/failure_frequency"] = (failures.sum() / calls.sum()).item() if calls.sum() > 0 else 0.0
        # From scoring, rewards' log_metric and hooks: the mean of the processes' values, under the names any
        # process has (a reward may log a metric on some processes only), in one order on every process.
        names = sorted(set().union(*gather_object([list(scored.metrics)])))
        if names:
            values = gather(torch.tensor([[scored.metrics.get(name, math.nan) for name in names]]))
            metrics |= dict(zip(names, values.nanmean(dim=0).tolist()))
        for index, name in enumerate(self.scorer.rewards):
            column = rewards_per_func[:, index]
            metrics[f"rewards/{name}/mean"] = column.nanmean().item()
            metrics[f"rewards/{name}/std"] = nanstd(column).item()
        return metrics


def completions_of(result: RolloutResult, tokenizer, eos_token_ids: list[int], with_logprobs: bool) -> Completions:
    """A custom rollout's lists as the (N, T) tensors the training batch is made of."""
    if with_logprobs and result.logprobs is None:
        raise PluginError("The rollout plugin returned no `logprobs`, which this run's rollout correction needs.")
    width = max(1, max(len(ids) for ids in result.completion_ids))

    def padded(rows, value, dtype):  # (N, width)
        return torch.tensor([list(row) + [value] * (width - len(row)) for row in rows], dtype=dtype)

    ids = result.completion_ids
    completion_ids = padded(ids, tokenizer.pad_token_id, torch.long)
    completion_mask = padded([[1] * len(row) for row in ids], 0, torch.int)
    return Completions(
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        is_truncated=is_truncated(completion_ids, completion_mask, eos_token_ids, tokenizer.pad_token_id),
        sampling_per_token_logps=None if result.logprobs is None else padded(result.logprobs, 0.0, torch.float),
        tool_mask=None if result.env_mask is None else padded(result.env_mask, 0, torch.int),
    )


def versioned(scored: ScoredBatch, version: int) -> ScoredBatch:
    """The batch with each completion tagged as sampled by the weights of `version` optimizer steps."""
    versions = torch.full((len(scored.rows),), version, dtype=torch.long)  # (N,)
    return replace(scored, generated=replace(scored.generated, weight_versions=versions))


def _same_groups(replaced: ScoredBatch, scored: ScoredBatch, who: str) -> None:
    if replaced.num_groups != scored.num_groups:
        raise PluginError(
            f"{who} returned {replaced.num_groups} groups for a batch of {scored.num_groups}: a filter must keep "
            "the batch size (replace the groups it drops with groups from `draw`)."
        )


def _same_shape(replaced: torch.Tensor, advantages: torch.Tensor, who: str) -> None:
    if replaced.shape != advantages.shape:
        raise PluginError(
            f"{who} returned advantages of shape {tuple(replaced.shape)} for {tuple(advantages.shape)}: "
            "return one advantage per completion."
        )
