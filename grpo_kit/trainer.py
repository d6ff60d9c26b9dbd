"""The training loop, top to bottom: rollout, objective, optimizer step, log, save.

Batch sizes follow TRL's GRPOTrainer. A micro-batch holds `per_device_train_batch_size` completions; an
optimizer step accumulates `gradient_accumulation_steps` micro-batches; a generation batch holds
`steps_per_generation` micro-batches (by default one optimizer step's worth) and is trained on
`num_iterations` times before the next one is generated.
"""

import logging
import math
import signal
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from accelerate.utils import ProjectConfiguration, set_seed
from omegaconf import DictConfig, OmegaConf
from transformers import get_scheduler

from grpo_kit.checkpoint import check_resumable, find_checkpoint, load_checkpoint, restore_random_states, restore_run_files, save_checkpoint
from grpo_kit.checks import check_model_path, check_prompt_lengths, check_reward_columns
from grpo_kit.config import complete, options
from grpo_kit.data import PromptSampler, load_prompts
from grpo_kit.evaluation import Evaluator, load_eval_prompts
from grpo_kit.lock import write_or_compare
from grpo_kit.loggers import ConsoleLogger, JsonlLogger
from grpo_kit.modeling import load_model, load_reference_model, mix_into_reference, per_token_logps_and_entropies
from grpo_kit.objective import Objective, build_objective
from grpo_kit.pipeline import Run
from grpo_kit.replay import RolloutRecorder, RolloutReplay
from grpo_kit.plugins import PluginError, Registry
from grpo_kit.rollout import Rollout
from grpo_kit.samples import SampleLog
from grpo_kit.scoring import Scorer
from grpo_kit.trackers import TrackerLogger, check_trackers

log = logging.getLogger(__name__)


def build_advantage(cfg: DictConfig, registry: Registry | None = None):
    """The advantage estimator: (N, K) rewards (NaN = None), (K,) weights, group size -> (N,) advantages."""
    registry = registry or Registry()
    estimator = registry.build("advantage", cfg.advantage.name, options(cfg.advantage))

    def advantages(rewards_per_func, weights, num_generations):
        # An unscorable completion (NaN) carries no signal: advantage 0, so it does not move the policy.
        return torch.nan_to_num(estimator(rewards_per_func, weights, num_generations), nan=0.0)

    return advantages


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
    checkpoint = find_checkpoint(cfg.trainer.resume, run_dir) if cfg.trainer.resume else None
    if checkpoint is None and (run_dir / "metrics.jsonl").exists():
        raise FileExistsError(
            f"{run_dir} already holds a run (metrics.jsonl): it is left untouched. "
            "Choose another directory with hydra.run.dir=..."
        )

    # Every plugin is built before the model is loaded, so a bad name or option costs nothing.
    objective = build_objective(cfg, registry)
    advantage = build_advantage(cfg, registry)
    rewards, reward_weights = build_rewards(cfg, registry)
    generation = registry.build("generation", cfg.generation.name, options(cfg.generation))
    hook_plugins = [registry.build("hook", name, options(node)) for name, node in cfg.hook.items()]

    t, algo = cfg.trainer, cfg.algorithm
    num_generations = cfg.generation.num_generations
    steps_per_generation = algo.steps_per_generation or t.gradient_accumulation_steps
    # accelerate keeps its settings per process; an earlier run in this process (a sweep run by the basic
    # launcher, a notebook) may have chosen another precision. The process group itself (PartialState) is kept.
    AcceleratorState._reset_state()
    trackers = check_trackers(list(t.report_to))
    accelerator = Accelerator(
        gradient_accumulation_steps=t.gradient_accumulation_steps,
        mixed_precision=t.mixed_precision,
        log_with=trackers or None,
        project_config=ProjectConfiguration(project_dir=str(run_dir), logging_dir=str(run_dir / "trackers")),
    )
    generation_batch_size = t.per_device_train_batch_size * steps_per_generation  # completions, this process
    if generation_batch_size * accelerator.num_processes % num_generations:
        raise ValueError(
            f"A generation batch holds per_device_train_batch_size x steps_per_generation x processes = "
            f"{generation_batch_size * accelerator.num_processes} completions, which is not a multiple of "
            f"generation.num_generations={num_generations}: change one of them."
        )
    replay = RolloutReplay(cfg.rollouts.replay, num_generations, generation_batch_size) if cfg.rollouts.replay else None
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    write_or_compare(run_dir, registry, cfg)
    set_seed(cfg.seed)

    check_model_path(cfg.model.name_or_path)
    prompts = load_prompts(cfg.data)
    eval_prompts = load_eval_prompts(cfg.eval, cfg.data)
    every_prompt_set = [dataset for dataset in (prompts, eval_prompts) if dataset is not None]
    for dataset in every_prompt_set:
        check_reward_columns(rewards, dataset)
    model, tokenizer = load_model(cfg.model)
    for dataset in every_prompt_set:
        check_prompt_lengths(
            dataset, tokenizer, cfg.generation.max_completion_length,
            getattr(model.config, "max_position_embeddings", None),
        )
    reference = load_reference_model(model, accelerator.device) if algo.beta != 0.0 else None
    sampler = PromptSampler(
        prompts, cfg.seed, cfg.data.shuffle, accelerator.process_index, accelerator.num_processes
    )
    optimizer = torch.optim.AdamW(
        [parameter for parameter in model.parameters() if parameter.requires_grad],
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
    resumed = load_checkpoint(checkpoint) if checkpoint is not None else None
    if resumed is not None:
        check_resumable(resumed["config"], cfg, checkpoint)
        accelerator.unwrap_model(model).load_state_dict(resumed["model"])
        optimizer.load_state_dict(resumed["optimizer"])
        scheduler.load_state_dict(resumed["scheduler"])
        sampler.restore(resumed["sampler"])
        restore_run_files(checkpoint, run_dir)
        log.info("Resuming from %s (step %d)", checkpoint, resumed["step"])
    generation.start(model, tokenizer, accelerator)
    references = ReferenceQuantities(
        objective,
        reference,
        accelerator.autocast,
        temperature=cfg.generation.temperature,
        # Old log-probs are needed once the policy may have moved since the batch was generated.
        off_policy=t.gradient_accumulation_steps % (steps_per_generation * algo.num_iterations) != 0,
    )

    pm = registry.plugin_manager
    run_plugins = [JsonlLogger(), ConsoleLogger(), *([TrackerLogger()] if trackers else []), *hook_plugins]
    for plugin in run_plugins:
        pm.register(plugin)
    hooks = pm.hook
    scorer = Scorer(rewards, timeout=t.reward_timeout, workers=t.reward_workers)
    rollout = Rollout(
        sampler,
        generation,
        scorer,
        reward_weights,
        advantage,
        tokenizer,
        num_generations,
        algo.mask_truncated_completions,
        hooks,
        with_logprobs=references.wants_sampling_logps,
        replay=replay,
        recorder=RolloutRecorder(run_dir) if cfg.rollouts.save else None,
    )
    evaluator = None
    if eval_prompts is not None:
        evaluator = Evaluator(eval_prompts, rollout, cfg.eval, cfg.seed, t.max_steps, accelerator)
    samples = None
    if t.sample_every > 0 and accelerator.is_main_process:
        samples = SampleLog(run_dir, every=t.sample_every, max_rows=t.sample_rows)
    start_step = resumed["step"] if resumed is not None else 0
    run = Run(cfg, run_dir, accelerator, model, tokenizer, t.max_steps, start_step)
    prompts_per_generation = generation_batch_size * accelerator.num_processes // num_generations
    try:
        hooks.on_train_start(run=run)
        window: dict[str, list[float]] = defaultdict(list)
        micro_step = 0
        if resumed is not None:  # the step's pending generation batch, its metrics, and every random generator
            micro_step, micro_batches = resumed["micro_step"], resumed["micro_batches"]
            rollout_metrics = resumed["rollout_metrics"]
            window.update(resumed["window"])
            restore_random_states(resumed["random"])
        if evaluator is not None and cfg.eval.on_start and start_step == 0:
            model.eval()
            hooks.on_log(run=run, step=0, metrics={"step": 0, **evaluator(0)})
        stop = StopRequest()
        bad_steps = 0
        for step in range(start_step + 1, t.max_steps + 1):
            started = time.perf_counter()
            model.train()
            finite = True  # a non-finite loss anywhere in the step skips the whole optimizer step
            for _ in range(t.gradient_accumulation_steps):
                if micro_step % (steps_per_generation * algo.num_iterations) == 0:
                    model.eval()
                    micro_batches, rollout_metrics = generate_batch(
                        rollout, run, references, model, prompts_per_generation, steps_per_generation, accelerator
                    )
                    model.train()
                    if samples is not None:
                        samples.record(step, *sample_columns(rollout))
                micro_batch = micro_batches[micro_step % steps_per_generation]
                micro_step += 1
                for name, value in rollout_metrics.items():  # the generation batch this micro-batch came from
                    window[name].append(value)

                with accelerator.accumulate(model):
                    per_token_logps, entropies = per_token_logps_and_entropies(
                        model, micro_batch, cfg.generation.temperature, entropy_grad=algo.entropy_coef != 0.0
                    )
                    out = objective(
                        per_token_logps,
                        entropies,
                        micro_batch,
                        gradient_accumulation_steps=t.gradient_accumulation_steps,
                        steps_per_generation=steps_per_generation,
                        num_processes=accelerator.num_processes,
                    )
                    finite = finite and bool(torch.isfinite(out.loss))
                    if finite:
                        accelerator.backward(out.loss)
                    if accelerator.sync_gradients:
                        if finite:
                            grad_norm = accelerator.clip_grad_norm_(model.parameters(), t.max_grad_norm)
                            optimizer.step()
                            scheduler.step()
                        optimizer.zero_grad()
                window["loss/micro"].append(out.loss.item())
                for name, value in out.metrics.items():
                    window[name].append(accelerator.gather(value).nanmean().item())
            generation.update_weights(model)
            if algo.sync_ref_model and step % algo.ref_model_sync_steps == 0:
                mix_into_reference(accelerator.unwrap_model(model), reference, algo.ref_model_mixup_alpha)

            bad_steps = 0 if finite else bad_steps + 1
            if not finite:
                log.warning("Step %d had a non-finite loss: skipping the step (%d in a row)", step, bad_steps)
                stop.requested = stop.requested or ("non-finite losses" if bad_steps >= t.max_bad_steps else None)
            else:
                window["grad_norm"].append(float(grad_norm))
            window["seconds_per_step"].append(time.perf_counter() - started)
            hooks.on_step_end(run=run, step=step, metrics={name: values[-1] for name, values in window.items()})
            evaluated = {}
            if evaluator is not None and evaluator.due(step):
                model.eval()
                evaluated = evaluator(step)
            if step % t.logging_steps == 0 or step == t.max_steps or evaluated:
                logged = summarise(window, step, t.gradient_accumulation_steps, scheduler.get_last_lr()[0])
                window.clear()
                hooks.on_log(run=run, step=step, metrics=logged | evaluated)
            if (t.save_steps and step % t.save_steps == 0) or step == t.max_steps or stop.requested:
                state = {
                    "model": accelerator.unwrap_model(model).state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(),
                    "sampler": sampler.state(),
                    "micro_step": micro_step,
                    "micro_batches": micro_batches,
                    "rollout_metrics": rollout_metrics,
                    "window": dict(window),
                    "config": OmegaConf.to_container(cfg, resolve=True),
                }
                if accelerator.is_main_process:
                    save_checkpoint(run_dir, step, state, keep=t.save_total_limit)
            if stop.requested == "non-finite losses":
                raise RuntimeError(
                    f"{bad_steps} steps in a row had a non-finite loss, so the run stopped after saving a checkpoint "
                    f"at step {step}. Lower trainer.learning_rate or check the rewards, then resume with "
                    "trainer.resume=auto."
                )
            if stop.requested:
                log.warning("Stopped by %s after step %d: resume with trainer.resume=auto", stop.requested, step)
                break

        generation.close()
        if t.save_model and accelerator.is_main_process and not stop.requested:
            accelerator.unwrap_model(model).save_pretrained(run_dir / "model")
            tokenizer.save_pretrained(run_dir / "model")
            hooks.on_save(run=run, directory=run_dir / "model")
        hooks.on_train_end(run=run)
    finally:
        stop.restore()
        scorer.close()
        for plugin in run_plugins:
            pm.unregister(plugin)
    return run_dir


class StopRequest:
    """SIGINT or SIGTERM: finish the step under way, save a checkpoint and stop, instead of dying mid-step."""

    def __init__(self):
        self.requested: str | None = None
        self.previous = {sig: signal.signal(sig, self._request) for sig in (signal.SIGINT, signal.SIGTERM)}

    def _request(self, signum, frame):
        self.requested = signal.Signals(signum).name

    def restore(self):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


@dataclass
class ReferenceQuantities:
    """What a micro-batch needs besides its own forward pass: old, reference and rollout-correction terms."""

    objective: Objective
    reference: Callable | None  # the frozen reference model, when algorithm.beta > 0
    autocast: Callable  # the mixed-precision context the policy's forward passes run in
    temperature: float
    off_policy: bool

    @property
    def wants_sampling_logps(self) -> bool:
        return self.objective.correction.level is not None

    @torch.no_grad()
    def add(self, policy, micro_batch: dict[str, torch.Tensor]) -> None:
        sampling = micro_batch.get("sampling_per_token_logps")
        corrected = sampling is not None and self.wants_sampling_logps
        if self.off_policy or corrected:
            micro_batch["old_per_token_logps"], _ = per_token_logps_and_entropies(policy, micro_batch, self.temperature)
        if corrected:
            micro_batch["importance_sampling_ratio"] = self.objective.rollout_correction(
                micro_batch["old_per_token_logps"], sampling, micro_batch["completion_mask"]
            )
        if self.reference is not None:
            with self.autocast():
                micro_batch["ref_per_token_logps"], _ = per_token_logps_and_entropies(
                    self.reference, micro_batch, self.temperature
                )


@torch.no_grad()
def generate_batch(rollout, run, references, model, num_prompts, steps_per_generation, accelerator):
    """A scored generation batch, shuffled and split into `steps_per_generation` micro-batches."""
    batch, metrics = rollout(run, num_prompts)
    batch = {name: tensor.to(accelerator.device) for name, tensor in batch.items()}
    # Token normalisers (dapo, cispo) divide by the active tokens of the whole batch on every process.
    batch["num_items_in_batch"] = accelerator.gather(batch["completion_mask"].sum()).sum()
    size = batch["completion_ids"].shape[0]
    order = torch.randperm(size, device=accelerator.device)
    micro_batches = []
    for indices in order.chunk(steps_per_generation):
        micro_batch = {name: tensor if tensor.dim() == 0 else tensor[indices] for name, tensor in batch.items()}
        references.add(model, micro_batch)
        micro_batches.append(micro_batch)
    return micro_batches, metrics


def sample_columns(rollout):
    scored, advantages = rollout.last
    return scored.prompts, scored.completions, scored.rewards_per_func, list(rollout.scorer.rewards), advantages


def summarise(window: dict[str, list[float]], step: int, accumulation: int, learning_rate: float) -> dict:
    """One logged line: the means over the logging window, and the loss of an optimizer step."""
    logged = {"step": step}
    for name, values in window.items():
        if name == "loss/micro":
            logged["loss"] = sum(values) / len(values) * accumulation  # a step's micro losses add up to its loss
        else:
            present = [value for value in values if not math.isnan(value)]
            logged[name] = sum(present) / len(present) if present else math.nan
    logged["learning_rate"] = learning_rate
    return logged
