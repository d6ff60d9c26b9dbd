"""GRPO in one file: how grpo_kit computes a training step, without the plugins.

Sample a group of completions for each prompt, reward them, compare each reward with its group's, and take AdamW
steps on the clipped surrogate reduced to DAPO's token mean. This is what `python -m grpo_kit +loss=dapo
+reward=accuracy` computes on the embedded model, with each plugin written out in place: loss=dapo,
importance_sampling=token, advantage=group, rollout_correction=none, beta=0 (no reference model).
tests/test_grpo_in_one_file.py checks that two optimizer steps of this file and of grpo_kit's trainer, on the same
completions, give the same losses, gradient norms and weights (within 1e-6). The trainer adds what real runs need:
several processes, the other plugins, checkpoints, logging, evaluation, and speed-ups that change only the float
rounding.

The papers: GRPO, DeepSeekMath (Shao et al. 2024) https://arxiv.org/abs/2402.03300; DAPO (Yu et al. 2025)
https://arxiv.org/abs/2503.14476; PPO's clipped surrogate (Schulman et al. 2017) https://arxiv.org/abs/1707.06347.

    python docs/grpo_in_one_file.py
"""

import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, get_linear_schedule_with_warmup


@dataclass
class Config:
    """grpo_kit's defaults for the embedded model (conf/model/embedded.yaml, conf/data/embedded.yaml), TRL's for the
    rest."""

    num_generations: int = 8  # G: the completions of one prompt, whose rewards are compared
    max_completion_length: int = 4
    temperature: float = 1.0
    per_device_train_batch_size: int = 128  # completions per micro-batch
    gradient_accumulation_steps: int = 1  # micro-batches per optimizer step
    steps_per_generation: int | None = None  # micro-batches per generation batch; None: gradient_accumulation_steps
    num_iterations: int = 1  # passes over each generation batch (mu in DeepSeekMath's algorithm 1)
    epsilon_low: float = 0.2  # PPO's clip range below a ratio of 1
    epsilon_high: float = 0.2  # and above it: DAPO's clip-higher raises it (0.28 in the paper)
    learning_rate: float = 8e-4
    adam_betas: tuple[float, float] = (0.9, 0.999)
    adam_epsilon: float = 1e-8
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    max_steps: int = 500
    warmup_ratio: float = 0.05  # the learning rate rises linearly over this share of the steps, then falls to 0
    seed: int = 42

    def __post_init__(self):
        self.steps_per_generation = self.steps_per_generation or self.gradient_accumulation_steps


@torch.no_grad()
def generate(model, tokenizer, prompts: list[str], config: Config) -> dict[str, torch.Tensor]:
    """`num_generations` completions of each prompt, sampled from the policy; each ends at its first EOS, which it
    keeps, or at max_completion_length. Prompts are padded on the left, completions on the right."""
    prompts = [prompt for prompt in prompts for _ in range(config.num_generations)]  # a group's rows are adjacent
    inputs = tokenizer(prompts, padding=True, padding_side="left", add_special_tokens=False, return_tensors="pt")
    inputs = inputs.to(model.device)
    sequences = model.generate(
        **inputs,
        do_sample=True,
        temperature=config.temperature,
        top_p=1.0,
        top_k=0,
        max_new_tokens=config.max_completion_length,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,  # grpo_kit also stops at every EOS of the model's generation config
    )
    completion_ids = sequences[:, inputs.input_ids.shape[1] :]  # (N, T)
    is_eos = completion_ids == tokenizer.eos_token_id  # (N, T)
    first_eos = torch.where(is_eos.any(dim=1), is_eos.int().argmax(dim=1), completion_ids.shape[1])  # (N,)
    positions = torch.arange(completion_ids.shape[1], device=completion_ids.device)  # (T,)
    completion_mask = (positions <= first_eos.unsqueeze(1)).int()  # (N, T)
    return {
        "prompt_ids": inputs.input_ids,  # (N, P)
        "prompt_mask": inputs.attention_mask,  # (N, P)
        "completion_ids": completion_ids.masked_fill(completion_mask == 0, tokenizer.pad_token_id),  # (N, T)
        "completion_mask": completion_mask,  # (N, T)
    }


def accuracy(prompts: list[str], completions: list[str], solution: list[str], **columns) -> list[float]:
    """The embedded sums task's reward: 1.0 where the completion is the sum, else 0.0. (grpo_kit's accuracy
    reward also takes other spellings of the right number, such as "012", through math-verify.)"""
    return [float(completion.strip() == answer) for completion, answer in zip(completions, solution)]


def group_advantages(rewards: torch.Tensor, num_generations: int) -> torch.Tensor:  # (N,)
    """DeepSeekMath section 4.1.2: each reward minus its group's mean, over its group's standard deviation (TRL's
    scale_rewards="group"); the 1e-4 leaves a group of equal rewards at advantage 0."""
    groups = rewards.view(-1, num_generations)  # (N / G, G)
    centred = groups - groups.mean(dim=1, keepdim=True)
    return (centred / (groups.std(dim=1, keepdim=True) + 1e-4)).view(-1)


def per_token_logps(model, batch: dict[str, torch.Tensor], temperature: float) -> torch.Tensor:  # (B, T)
    """log pi(token | the tokens before it) of each completion token, at the temperature it was sampled at."""
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)  # (B, P + T)
    attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)  # (B, P + T)
    length = batch["completion_ids"].shape[1]
    logits = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=length + 1).logits
    log_probs = (logits[:, :-1].float() / temperature).log_softmax(dim=-1)  # (B, T, V): position t predicts token t
    return log_probs.gather(-1, batch["completion_ids"].unsqueeze(-1)).squeeze(-1)


def clipped_surrogate(logps, old_logps, advantages, config: Config) -> torch.Tensor:  # (B, T)
    """PPO's clipped objective (arXiv 1707.06347, eq. 7) for each token, as GRPO applies it (arXiv 2402.03300,
    eq. 3), with DAPO's decoupled clip range (arXiv 2503.14476, section 3.1, "Clip-Higher"); negated, to be
    minimised."""
    ratio = torch.exp(logps - old_logps)  # (B, T): pi_theta / pi_old of each token
    clipped_ratio = torch.clamp(ratio, 1 - config.epsilon_low, 1 + config.epsilon_high)
    advantages = advantages.unsqueeze(1)  # (B, 1): each token of a completion has the completion's advantage
    return -torch.min(ratio * advantages, clipped_ratio * advantages)


def token_mean(per_token_loss, completion_mask, batch_tokens: torch.Tensor, config: Config) -> torch.Tensor:
    """DAPO's token-level loss (arXiv 2503.14476, section 3.3; TRL's default loss_type="dapo"): the sum over a
    micro-batch's completion tokens, divided by the tokens of one optimizer step's share of the generation batch
    (`batch_tokens`, the whole batch's; with several processes, every process's divided by their number). Every
    token then weighs the same, whatever the length of its completion or the split into micro-batches, and a step's
    micro-batch losses add up to the mean over its tokens."""
    step_tokens = batch_tokens * config.gradient_accumulation_steps / config.steps_per_generation
    return (per_token_loss * completion_mask).sum() / step_tokens


def rollout(model, tokenizer, rows: list[dict], config: Config, generate: Callable, reward: Callable):
    """A generation batch for the prompts of `rows`: generate -> reward -> advantages. Returns the batch and its
    rewards; the rows' other columns (the sums' `solution`) reach the reward as keyword arguments, as in TRL."""
    batch = generate(model, tokenizer, [row["prompt"] for row in rows], config)
    rows = [row for row in rows for _ in range(config.num_generations)]
    lengths = batch["completion_mask"].sum(dim=1).tolist()
    completion_ids = [ids[:length] for ids, length in zip(batch["completion_ids"].tolist(), lengths)]
    completions = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
    columns = {key: [row[key] for row in rows] for key in rows[0] if key != "prompt"}
    rewards = torch.tensor(reward(prompts=[row["prompt"] for row in rows], completions=completions, **columns))  # (N,)
    batch["advantages"] = group_advantages(rewards.float(), config.num_generations).to(model.device)  # (N,)
    return batch, rewards


def micro_batches(batch: dict[str, torch.Tensor], count: int) -> list[dict[str, torch.Tensor]]:
    """The generation batch shuffled and cut into `count` micro-batches, as TRL cuts it."""
    order = torch.randperm(len(batch["advantages"]), device=batch["advantages"].device)
    return [{name: tensor[rows] for name, tensor in batch.items()} for rows in order.chunk(count)]


def train(
    model,
    tokenizer,
    prompt_rows: Iterator[list[dict]],
    config: Config,
    generate: Callable = generate,
    reward: Callable = accuracy,
) -> list[dict[str, float]]:
    """`config.max_steps` optimizer steps, each on gradient_accumulation_steps micro-batches; a generation batch of
    steps_per_generation micro-batches, for the next rows of `prompt_rows`, is trained on num_iterations times
    before the next one. Returns each step's mean reward, loss and gradient norm (before clipping), as grpo_kit logs
    them."""
    # Weight decay spares biases and norm weights, as transformers' Trainer (and so TRL) does.
    parameters = [parameter for parameter in model.parameters() if parameter.requires_grad]
    groups = [
        {"params": [p for p in parameters if p.dim() >= 2], "weight_decay": config.weight_decay},
        {"params": [p for p in parameters if p.dim() < 2], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(  # TRL's default optimizer, adamw_torch_fused
        groups, lr=config.learning_rate, betas=config.adam_betas, eps=config.adam_epsilon, fused=True
    )
    warmup_steps = math.ceil(config.warmup_ratio * config.max_steps)
    scheduler = get_linear_schedule_with_warmup(optimizer, warmup_steps, config.max_steps)
    accumulation, steps_per_generation = config.gradient_accumulation_steps, config.steps_per_generation
    # The policy moves between generating a batch and training on some of it: pi_old is then the generating policy.
    off_policy = accumulation % (steps_per_generation * config.num_iterations) != 0
    history, micro_step = [], 0
    model.train()  # the samples, the old and the trained log-probs all come from training mode, as in TRL
    for step in range(1, config.max_steps + 1):
        step_loss = 0.0
        for _ in range(accumulation):
            if micro_step % (steps_per_generation * config.num_iterations) == 0:
                batch, rewards = rollout(model, tokenizer, next(prompt_rows), config, generate, reward)
                batch_tokens = batch["completion_mask"].sum()
                batches = micro_batches(batch, steps_per_generation)
                if off_policy:
                    with torch.no_grad():
                        for micro_batch in batches:
                            micro_batch["old_logps"] = per_token_logps(model, micro_batch, config.temperature)
            micro_batch = batches[micro_step % steps_per_generation]
            micro_step += 1

            logps = per_token_logps(model, micro_batch, config.temperature)  # (B, T)
            # On-policy, pi_old is pi_theta itself: the ratio is 1, but its gradient is the policy gradient.
            old_logps = micro_batch["old_logps"] if off_policy else logps.detach()
            per_token_loss = clipped_surrogate(logps, old_logps, micro_batch["advantages"], config)
            loss = token_mean(per_token_loss, micro_batch["completion_mask"], batch_tokens, config)
            loss.backward()
            step_loss += loss.item()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm).item()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        history.append({"step": step, "reward": rewards.mean().item(), "loss": step_loss, "grad_norm": grad_norm})
        print(f"step {step}: mean reward {history[-1]['reward']:.3f}, loss {step_loss:.4f}, grad norm {grad_norm:.3f}")
    return history


def main():
    """Train the embedded tiny model on its sums task, which grpo_kit builds here from a seed: no download."""
    from grpo_kit.embedded import sums

    config = Config(max_steps=100)  # about 20 s on two CPU cores: the mean reward climbs from about 0.15 to 0.35
    torch.manual_seed(config.seed)
    tokenizer = AutoTokenizer.from_pretrained(sums.model_path())
    model = AutoModelForCausalLM.from_pretrained(sums.model_path(), dtype=torch.float32)
    prompts_per_generation = config.per_device_train_batch_size * config.steps_per_generation // config.num_generations

    def prompt_rows():  # the task's rows in a new order each epoch
        rows, shuffler = sums.build_task(2000), random.Random(config.seed)
        while True:
            shuffler.shuffle(rows)
            for start in range(0, len(rows) - prompts_per_generation + 1, prompts_per_generation):
                yield rows[start : start + prompts_per_generation]

    train(model, tokenizer, prompt_rows(), config)


if __name__ == "__main__":
    main()
