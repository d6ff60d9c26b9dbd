"""The training loop, top to bottom: rollout, objective, optimizer step, log, save.

Batch sizes follow TRL's GRPOTrainer. A micro-batch holds `per_device_train_batch_size` completions; an
optimizer step accumulates `gradient_accumulation_steps` micro-batches; a generation batch holds
`steps_per_generation` micro-batches (by default one optimizer step's worth) and is trained on
`num_iterations` times before the next one is generated.
"""

import json
import logging
import math
import time
from collections import defaultdict
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm
from transformers import get_scheduler

from grpo_kit.config import complete, options
from grpo_kit.data import PromptSampler, load_prompts
from grpo_kit.modeling import load_model, per_token_logps_and_entropies
from grpo_kit.objective import build_objective
from grpo_kit.plugins import PluginError, Registry
from grpo_kit.rollout import Rollout

log = logging.getLogger(__name__)


def build_advantage(cfg: DictConfig, registry: Registry | None = None):
    registry = registry or Registry()
    return registry.build("advantage", cfg.advantage.name, options(cfg.advantage))


def build_rewards(cfg: DictConfig, registry: Registry) -> tuple[dict, torch.Tensor]:
    """The selected reward functions, by name, and their weights (K,)."""
    if not cfg.reward:
        raise PluginError(f"No reward selected: add +reward=NAME (installed: {', '.join(registry.names('reward'))}).")
    functions = {name: registry.build("reward", name, options(node)) for name, node in cfg.reward.items()}
    weights = torch.tensor([float(node.weight) for node in cfg.reward.values()])
    return functions, weights


def train(cfg: DictConfig, run_dir: str | Path, registry: Registry | None = None) -> Path:
    """Train as `cfg` says; the run directory receives config.yaml, metrics.jsonl and the final model."""
    registry = registry or Registry()
    cfg = complete(cfg, registry)
    run_dir = Path(run_dir)
    if (run_dir / "metrics.jsonl").exists():
        raise FileExistsError(
            f"{run_dir} already holds a run (metrics.jsonl): it is left untouched. "
            "Choose another directory with hydra.run.dir=..."
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))

    # Every plugin is built before the model is loaded, so a bad name or option costs nothing.
    objective = build_objective(cfg, registry)
    advantage = build_advantage(cfg, registry)
    rewards, reward_weights = build_rewards(cfg, registry)
    generation = registry.build("generation", cfg.generation.name, options(cfg.generation))

    t, algo = cfg.trainer, cfg.algorithm
    num_generations = cfg.generation.num_generations
    steps_per_generation = algo.steps_per_generation or t.gradient_accumulation_steps
    accelerator = Accelerator(gradient_accumulation_steps=t.gradient_accumulation_steps)
    generation_batch_size = t.per_device_train_batch_size * steps_per_generation  # completions, this process
    if generation_batch_size * accelerator.num_processes % num_generations:
        raise ValueError(
            f"A generation batch holds per_device_train_batch_size x steps_per_generation x processes = "
            f"{generation_batch_size * accelerator.num_processes} completions, which is not a multiple of "
            f"generation.num_generations={num_generations}: change one of them."
        )
    set_seed(cfg.seed)

    model, tokenizer = load_model(cfg.model)
    sampler = PromptSampler(load_prompts(cfg.data), seed=cfg.seed, shuffle=cfg.data.shuffle)
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=t.learning_rate,
        betas=(t.adam_beta1, t.adam_beta2),
        eps=t.adam_epsilon,
        weight_decay=t.weight_decay,
    )
    scheduler = get_scheduler(
        t.lr_scheduler_type,
        optimizer,
        num_warmup_steps=math.ceil(t.warmup_ratio * t.max_steps),
        num_training_steps=t.max_steps,
    )
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    generation.start(model, tokenizer, accelerator)
    rollout = Rollout(
        generation, rewards, reward_weights, advantage, tokenizer, num_generations, algo.mask_truncated_completions
    )
    temperature = cfg.generation.temperature
    # Old log-probs are needed once the policy has moved since the batch was generated.
    off_policy = algo.num_iterations > 1 or steps_per_generation > t.gradient_accumulation_steps
    prompts_per_generation = generation_batch_size * accelerator.num_processes // num_generations

    metrics_file = (run_dir / "metrics.jsonl").open("x")
    window: dict[str, list[float]] = defaultdict(list)
    progress = tqdm(range(t.max_steps), desc="grpo_kit", disable=not t.progress_bar or not accelerator.is_main_process)
    micro_step = 0
    for step in progress:
        started = time.perf_counter()
        model.train()
        for _ in range(t.gradient_accumulation_steps):
            if micro_step % (steps_per_generation * algo.num_iterations) == 0:
                rows = sampler.draw(prompts_per_generation)[accelerator.process_index :: accelerator.num_processes]
                model.eval()
                micro_batches, rollout_metrics = generate_batch(
                    rollout, model, rows, steps_per_generation, temperature, off_policy, accelerator
                )
                model.train()
            micro_batch = micro_batches[micro_step % steps_per_generation]
            micro_step += 1
            for name, value in rollout_metrics.items():  # the generation batch this micro-batch came from
                window[name].append(value)

            with accelerator.accumulate(model):
                per_token_logps, entropies = per_token_logps_and_entropies(model, micro_batch, temperature)
                out = objective(
                    per_token_logps,
                    entropies,
                    micro_batch,
                    gradient_accumulation_steps=t.gradient_accumulation_steps,
                    steps_per_generation=steps_per_generation,
                    num_processes=accelerator.num_processes,
                )
                accelerator.backward(out.loss)
                if accelerator.sync_gradients:
                    grad_norm = accelerator.clip_grad_norm_(model.parameters(), t.max_grad_norm)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            window["loss/micro"].append(out.loss.item())
            for name, value in out.metrics.items():
                window[name].append(accelerator.gather(value).mean().item())
        generation.update_weights(model)

        window["grad_norm"].append(float(grad_norm))
        window["seconds_per_step"].append(time.perf_counter() - started)
        if (step + 1) % t.logging_steps == 0 or step + 1 == t.max_steps:
            logged = summarise(window, step + 1, t.gradient_accumulation_steps, scheduler.get_last_lr()[0])
            window.clear()
            if accelerator.is_main_process:
                metrics_file.write(json.dumps(logged) + "\n")
                metrics_file.flush()
            progress.set_postfix(reward=f"{logged['reward']:.3f}", loss=f"{logged['loss']:.4f}")
    metrics_file.close()
    generation.close()

    if t.save_model and accelerator.is_main_process:
        accelerator.unwrap_model(model).save_pretrained(run_dir / "model")
        tokenizer.save_pretrained(run_dir / "model")
    return run_dir


@torch.no_grad()
def generate_batch(rollout, model, rows, steps_per_generation, temperature, off_policy, accelerator):
    """A scored generation batch, shuffled and split into `steps_per_generation` micro-batches."""
    batch, metrics = rollout(rows)
    batch = {name: tensor.to(accelerator.device) for name, tensor in batch.items()}
    # Token normalisers (dapo, cispo) divide by the active tokens of the whole batch on every process.
    batch["num_items_in_batch"] = accelerator.gather(batch["completion_mask"].sum()).sum()
    size = batch["completion_ids"].shape[0]
    order = torch.randperm(size, device=accelerator.device)
    micro_batches = []
    for indices in order.chunk(steps_per_generation):
        micro_batch = {
            name: tensor if tensor.dim() == 0 else tensor[indices] for name, tensor in batch.items()
        }
        if off_policy:
            micro_batch["old_per_token_logps"], _ = per_token_logps_and_entropies(model, micro_batch, temperature)
        micro_batches.append(micro_batch)
    return micro_batches, metrics


def summarise(window: dict[str, list[float]], step: int, accumulation: int, learning_rate: float) -> dict:
    """One metrics.jsonl line: the means over the logging window, and the loss of an optimizer step."""
    logged = {"step": step}
    for name, values in window.items():
        if name == "loss/micro":
            logged["loss"] = sum(values) / len(values) * accumulation  # a step's micro losses add up to its loss
        else:
            logged[name] = sum(values) / len(values)
    logged["learning_rate"] = learning_rate
    return logged
