"""The training loop, top to bottom: `train` is `setup`, then for each optimizer step `train_step` (rollout,
objective, optimizer step) and `end_of_step` (log, eval, save, stop), then the final model.

Batch sizes follow TRL's GRPOTrainer. A micro-batch holds `per_device_train_batch_size` completions; an
optimizer step accumulates `gradient_accumulation_steps` micro-batches; a generation batch holds
`steps_per_generation` micro-batches (by default one optimizer step's worth) and is trained on
`num_iterations` times before the next one is generated.
"""

import contextlib
import enum
import functools
import logging
import math
import os
import signal
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from accelerate.utils import ProjectConfiguration, gather_object, set_seed
from omegaconf import DictConfig, OmegaConf

from grpo_kit.config.compatibility import corrects_rollouts
from grpo_kit.config.compose import complete, options
from grpo_kit.contract.eos import eos_token_ids
from grpo_kit.contract.errors import ConfigError, GenerationUnavailable
from grpo_kit.contract.pipeline import Run, ScoredBatch
from grpo_kit.model.loading import load_model
from grpo_kit.model.precision import resolve_mixed_precision
from grpo_kit.model.sharding import (
    ACCELERATE_STATE,
    build_reference,
    check_moving_reference,
    configure_deepspeed,
    is_sharded,
    load_whole_weights,
    mix_into_sharded_reference,
    prepare_reference,
)
from grpo_kit.model.threads import use_torch_threads
from grpo_kit.objective.objective import Objective, ObjectiveOutput, build_objective, loss_mask
from grpo_kit.objective.policy_loss import PolicyLoss, build_policy_loss
from grpo_kit.outputs.checkpoints import (
    CHECKPOINTS,
    claim_run_directory,
    load_checkpoint,
    random_states,
    release_run_directory,
    restore_random_states,
    restore_run_files,
    resume_command,
    save_checkpoint,
    write_state,
    write_weights,
)
from grpo_kit.outputs.loggers import ConsoleLogger, JsonlLogger
from grpo_kit.outputs.plugin_lock import record_session
from grpo_kit.outputs.samples import SampleLog
from grpo_kit.outputs.trackers import TrackerLogger, accelerate_trackers, check_trackers
from grpo_kit.plugins.registry import Registry
from grpo_kit.report.collect import load_run
from grpo_kit.rollout.checks import check_model_path, check_prompt_lengths, check_reward_columns
from grpo_kit.rollout.evaluation import Evaluator, load_eval_prompts
from grpo_kit.rollout.prompts import PromptSampler, load_prompts, use_chat_template_kwargs
from grpo_kit.rollout.replay import RolloutRecorder, RolloutReplay
from grpo_kit.rollout.rollout import Rollout
from grpo_kit.rollout.scoring import Scorer, at_step, reward_trainer_state
from grpo_kit.training.batches import group_by_length, moves_before_use, split
from grpo_kit.training.builders import build_advantage, build_custom_rollout, build_hooks, build_rewards, build_tool_use
from grpo_kit.training.optimizers import build_optimizer, build_scheduler, check_optimization

log = logging.getLogger(__name__)


def train(cfg: DictConfig, run_dir: str | Path, registry: Registry | None = None) -> Path:
    """Train as `cfg` says; the run directory receives config.yaml, metrics.jsonl and the final model. Other
    processes are kept out of it (`claim_run_directory`) until the run ends, however it ends. A signal (SIGINT,
    SIGTERM) stops it after saving the step under way, raising `Stopped`."""
    try:
        return train_in(cfg, Path(run_dir), registry or Registry())
    finally:
        release_run_directory(Path(run_dir))


def train_in(cfg: DictConfig, run_dir: Path, registry: Registry) -> Path:
    """`train`, in the directory that `setup` claims."""
    state = setup(cfg, run_dir, registry)
    outputs, stop = state.outputs, state.outputs.stop
    try:
        outputs.hooks.on_train_start(run=state.run)
        state.session_start = (time.perf_counter(), state.num_tokens)
        if outputs.evaluator is not None and state.cfg.eval.on_start and state.step == 0:
            state.optimization.model.eval()
            outputs.hooks.on_log(run=state.run, step=0, metrics={"step": 0, **outputs.evaluator(0)})
        finished = not stop.reason and train_steps(state)  # a signal before the first step: nothing to train
        if finished and state.cfg.trainer.save_model:
            save_model(state)
        outputs.hooks.on_train_end(run=state.run)
    finally:
        outputs.close()
    if not finished:
        raise Stopped(
            stop.reason, f"Stopped by {stop.reason.value} after step {state.step}; resume with:\n  "
            f"{resume_command(state.run_dir)}"
        )
    if state.accelerator.is_main_process:
        log.info("Done: %s, %s", state.run_dir.resolve(), outcome(state.run_dir))
    return state.run_dir


def train_steps(state: "TrainState") -> bool:
    """The optimizer steps from the state's own to the last; False when a signal stopped them, after saving the
    step under way."""
    for step in range(state.step + 1, state.run.max_steps + 1):
        started = time.perf_counter()
        finite, grad_norm = train_step(state, step)
        stopping = end_of_step(state, step, finite, grad_norm, started)
        if stopping and step < state.run.max_steps:  # at the last step the run is finished however late it came
            return False
    return True


def setup(cfg: DictConfig, run_dir: Path, registry: Registry) -> "TrainState":
    """Everything the loop needs, checked before the model is loaded where it can be; resumed from a checkpoint
    when `trainer.resume` finds one. The returned state's outputs must be closed however the run ends."""
    cfg = complete(cfg, registry)
    checkpoint = claim_run_directory(run_dir, cfg)  # refuses before anything is written
    if cfg.trainer.resume and checkpoint is None:
        log.info("No checkpoint in %s: starting from step 0", run_dir)

    # Every plugin is built before the model is loaded, so a bad name or option costs nothing.
    objective = build_objective(cfg, registry)
    policy_loss = build_policy_loss(cfg, objective)  # the plain, chunked or Liger forward pass and loss
    advantage = build_advantage(cfg, registry)
    rewards, reward_weights = build_rewards(cfg, registry)
    generation = registry.build("generation", cfg.generation.name, options(cfg.generation))
    hook_plugins = build_hooks(cfg, registry)

    t, algo = cfg.trainer, cfg.algorithm
    num_generations = cfg.generation.num_generations
    steps_per_generation = algo.steps_per_generation or t.gradient_accumulation_steps
    by_length = group_by_length(cfg, objective.loss, steps_per_generation)
    trackers = check_trackers(list(t.report_to))
    accelerator = build_accelerator(t, run_dir, trackers)
    generation_batch_size = t.per_device_train_batch_size * steps_per_generation  # completions, this process
    check_processes(cfg, generation_batch_size, accelerator.num_processes)
    check_moving_reference(accelerator, cfg)
    prompts_per_generation = generation_batch_size // num_generations  # this process's whole groups
    replay = RolloutReplay(cfg.rollouts.replay, num_generations, generation_batch_size) if cfg.rollouts.replay else None
    check_model_path(cfg.model.name_or_path)
    prompts = load_prompts(cfg.data)
    eval_prompts = load_eval_prompts(cfg.eval, cfg.data)
    every_prompt_set = [dataset for dataset in (prompts, eval_prompts) if dataset is not None]
    for dataset in every_prompt_set if cfg.rollout is None else ():  # a rollout plugin may add the columns
        check_reward_columns(rewards, dataset, OmegaConf.to_container(cfg.reward, resolve=True))
    max_steps = t.max_steps
    if max_steps == -1:
        max_steps = steps_in_epochs(cfg, len(prompts), prompts_per_generation * accelerator.num_processes)
    check_optimization(t, accelerator.device, max_steps)

    if accelerator.is_main_process:
        log.info("Run directory: %s", run_dir.resolve())
        if accelerator.num_processes > 1:  # the log is the main process's alone: say that others train too
            log.info("%d processes train this run (%s)", accelerator.num_processes, accelerator.distributed_type.value)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "error.txt").unlink(missing_ok=True)  # left by an attempt that failed before this one
        (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    set_seed(cfg.seed)

    model, tokenizer = load_model(cfg.model, t.gradient_checkpointing_kwargs)
    use_torch_threads(t.torch_threads, model.config)
    use_chat_template_kwargs(tokenizer, OmegaConf.to_container(cfg.data, resolve=True)["chat_template_kwargs"])
    policy_loss.use_router_aux_loss(model, algo.router_aux_loss_coef)  # refused here for a model without experts
    if policy_loss.router_aux_loss_coef != 0.0 and by_length:
        if t.group_by_length:
            raise ConfigError(
                "trainer.group_by_length=true would change the gradient of this run's steps, because the router "
                "load-balancing loss of this mixture-of-experts model is computed over each micro-batch's tokens. "
                "Leave it null (grouping where it changes nothing) or false, or set algorithm.router_aux_loss_coef=0."
            )
        by_length = False
    eos = eos_token_ids(model, tokenizer)  # every backend, the tool loop and custom rollouts end completions at these
    for dataset in every_prompt_set:
        check_prompt_lengths(
            dataset, tokenizer, cfg.generation.max_completion_length,
            getattr(model.config, "max_position_embeddings", None),
        )
    reference = build_reference(cfg, model, accelerator) if algo.beta != 0.0 else None
    sampler = PromptSampler(
        prompts, cfg.seed, cfg.data.shuffle, accelerator.process_index, accelerator.num_processes
    )
    optimizer = build_optimizer(t, model)
    scheduler = build_scheduler(t, optimizer, max_steps)
    # The scheduler stays unprepared: accelerate would step it once per process, TRL steps it once per step.
    model, optimizer = accelerator.prepare(model, optimizer)
    reference = prepare_reference(reference, accelerator)
    optimization = Optimization(
        model, optimizer, scheduler, accelerator, policy_loss, t.gradient_accumulation_steps, steps_per_generation,
        t.max_grad_norm,
    )
    references = ReferenceQuantities(
        objective,
        policy_loss,
        reference,
        accelerator.autocast,
        # Old log-probs are needed once the policy may have moved since the batch was generated.
        off_policy=t.gradient_accumulation_steps % (steps_per_generation * algo.num_iterations) != 0,
        corrects_rollouts=corrects_rollouts(cfg, registry),
    )

    console = ConsoleLogger()
    # The trainer_state rewards receive, as TRL hands its own; `at_step` moves it on after each step.
    prompts_per_step = (prompts_per_generation * accelerator.num_processes * t.gradient_accumulation_steps
                        / (steps_per_generation * algo.num_iterations))
    trainer_state = reward_trainer_state(
        max_steps, max_steps * prompts_per_step / len(prompts), logging_steps=t.logging_steps,
        save_steps=t.save_steps, train_batch_size=t.per_device_train_batch_size,
        is_local_process_zero=accelerator.is_local_main_process, is_world_process_zero=accelerator.is_main_process,
    )
    scorer = Scorer(rewards, timeout=t.reward_timeout, workers=t.reward_workers, trainer_state=trainer_state)
    outputs = SideOutputs(
        registry.plugin_manager,
        [JsonlLogger(), console, *([TrackerLogger()] if trackers else []), *hook_plugins],
        console,
        scorer,
        StopRequest(),
    )
    try:
        generation.start(model, tokenizer, accelerator)
        outputs.generation = generation  # from here on it is closed however the run ends
        for plugin in outputs.plugins:
            outputs.plugin_manager.register(plugin)
        rollout = Rollout(
            sampler,
            generation,
            scorer,
            reward_weights,
            advantage,
            tokenizer,
            num_generations,
            algo.mask_truncated_completions,
            outputs.hooks,
            accelerator,
            eos_token_ids=eos,
            with_logprobs=references.wants_sampling_logps,
            replay=replay,
            recorder=RolloutRecorder(run_dir) if cfg.rollouts.save else None,
            tool_use=build_tool_use(cfg, registry, tokenizer, generation, accelerator, eos),
            custom=build_custom_rollout(cfg, registry),
        )
        state = TrainState(
            model=accelerator.unwrap_model(model),
            optimizer=optimizer,
            scheduler=scheduler,
            sampler=sampler,
            moving_reference=reference if algo.sync_ref_model else None,
            replay=replay,
            recorder=rollout.recorder,
            config=OmegaConf.to_container(cfg, resolve=True),
            accelerator=accelerator,
            cfg=cfg,
            run_dir=run_dir,
            run=Run(cfg, run_dir, accelerator, model, tokenizer, max_steps),
            rollout=rollout,
            references=references,
            optimization=optimization,
            generation=generation,
            split_batch=functools.partial(
                split, steps_per_generation=steps_per_generation, accumulation=t.gradient_accumulation_steps,
                by_length=by_length,
            ),
            prompts_per_generation=prompts_per_generation,
            outputs=outputs,
        )
        if checkpoint is not None:
            saved = load_checkpoint(checkpoint)
            if is_sharded(accelerator):  # every process reads its own part of the weights and optimizer state
                accelerator.load_state(checkpoint / ACCELERATE_STATE)
            restore_run_files(checkpoint, run_dir)
            state.load_state_dict(saved)  # the last setup step: it restores the random generators too
            at_step(trainer_state, state.step)
            generation.update_weights(model, state.step)
            state.run.start_step = state.step
            log.info("Resuming from %s (step %d)", checkpoint, state.step)
        if eval_prompts is not None:
            outputs.evaluator = Evaluator(
                eval_prompts, rollout, cfg.eval, cfg.seed, max_steps, accelerator,
                stopping=lambda: outputs.stop.reason is not None,
            )
        if t.sample_every > 0 and accelerator.is_main_process:
            outputs.samples = SampleLog(run_dir, every=t.sample_every, max_rows=t.sample_rows)
        if accelerator.is_main_process:  # the run lock: what trains from the step the run starts or resumes at
            record_session(run_dir, registry, cfg, state.step)
    except BaseException:
        outputs.close()
        raise
    return state


def train_step(state: "TrainState", step: int) -> tuple[bool, float]:
    """One optimizer step, in the objective's order: generate -> score -> advantages -> old and reference
    log-probs (a new generation batch, when the last one is used up), then for each micro-batch forward -> loss ->
    backward, then the optimizer step. Returns whether every loss of the step was finite, and the gradient norm."""
    cfg, model, window = state.cfg, state.optimization.model, state.window
    t, algo = cfg.trainer, cfg.algorithm
    steps_per_generation = state.optimization.steps_per_generation
    # Training mode from generation to the optimizer step, as in TRL: under dropout, the samples, the old log-probs
    # (computed at generation, or kept from the first training pass) and a LoRA policy's adapter-free reference
    # log-probs all come from training-mode passes, as the trained log-probs do. Only evaluation runs in eval mode.
    model.train()
    step_start = state.progress()  # where a generation backend that fails mid-step sends the run back
    finite, grad_norm = True, math.nan  # a non-finite loss anywhere in the step skips the whole optimizer step
    try:
        for index in range(t.gradient_accumulation_steps):
            if state.micro_step % (steps_per_generation * algo.num_iterations) == 0:
                state.micro_batches, state.rollout_metrics = generate_batch(
                    state.rollout, state.run, state.references, model, state.prompts_per_generation,
                    state.accelerator, state.split_batch,
                    moved=moves_before_use(state.micro_step, steps_per_generation, t.gradient_accumulation_steps),
                )
                state.num_tokens += tokens_seen(state.rollout.last[0], state.accelerator)
                if state.outputs.samples is not None:
                    state.outputs.samples.record(step, *sample_columns(state.rollout))
            position = state.micro_step % steps_per_generation
            micro_batch = state.micro_batches[position]
            state.micro_step += 1
            for name, value in state.rollout_metrics.items():  # the generation batch it came from
                window[name].append(value)

            ends_step = index == t.gradient_accumulation_steps - 1
            out, finite, step_grad_norm = state.optimization.train_on(micro_batch, finite, ends_step)
            if state.references.off_policy and "old_per_token_logps" not in micro_batch:
                # Trained on before the policy moved: its log-probs are the old ones of the iterations to come.
                state.micro_batches[position] = micro_batch | {"old_per_token_logps": out.per_token_logps}
            if step_grad_norm is not None:
                grad_norm = step_grad_norm
            window["loss/micro"].append(state.accelerator.gather(out.loss.detach().reshape(1)).mean().item())
            for name, value in out.metrics.items():
                window[name].append(state.accelerator.gather(value).nanmean().item())
    except GenerationUnavailable as error:  # the step is undone and the last whole one saved
        state.rewind(step_start)
        state.optimizer.zero_grad(set_to_none=True)
        raise saved_and_stopped(error, state) from error
    state.step = step
    at_step(state.outputs.scorer.trainer_state, step)
    if algo.sync_ref_model and step % algo.ref_model_sync_steps == 0:
        mix_into_sharded_reference(state.accelerator, model, state.references.reference, algo.ref_model_mixup_alpha)
    try:
        state.generation.update_weights(model, step)
    except GenerationUnavailable as error:  # the step itself is whole: save it and stop
        raise saved_and_stopped(error, state) from error
    return finite, grad_norm


def end_of_step(state: "TrainState", step: int, finite: bool, grad_norm: float, started: float) -> bool:
    """The step's side outputs: the non-finite count, hooks, eval, the logged line, a checkpoint. Returns whether a
    signal stops the run here (the checkpoint is then written whatever trainer.save_steps says), and raises after
    saving when losses stay non-finite."""
    t, window, outputs, stop = state.cfg.trainer, state.window, state.outputs, state.outputs.stop
    state.bad_steps = 0 if finite else state.bad_steps + 1
    if not finite:
        log.warning("Step %d had a non-finite loss: skipping the step (%d in a row)", step, state.bad_steps)
        if state.bad_steps >= t.max_bad_steps:
            stop.reason = stop.reason or StopReason.NON_FINITE_LOSSES
    else:
        window["grad_norm"].append(grad_norm)
    window["seconds_per_step"].append(time.perf_counter() - started)
    outputs.hooks.on_step_end(run=state.run, step=step, metrics={name: values[-1] for name, values in window.items()})
    evaluated = {}
    if outputs.evaluator is not None and outputs.evaluator.due(step):
        state.optimization.model.eval()
        try:
            evaluated = outputs.evaluator(step)
        except GenerationUnavailable as error:
            raise saved_and_stopped(error, state) from error
    if step % t.logging_steps == 0 or step == state.run.max_steps or evaluated:
        logged = summarise(window, step, t.gradient_accumulation_steps, state.optimization.learning_rate)
        logged |= token_counts(state)
        window.clear()
        outputs.hooks.on_log(run=state.run, step=step, metrics=logged | evaluated)
    stopping = stop.reason is not None  # read once: a signal that comes later stops the run after the next step
    if (t.save_steps and step % t.save_steps == 0) or step == state.run.max_steps or stopping:
        # A run that stops early saves the whole state, to go on from.
        save_step(state, weights_only=t.save_only_model and not stopping)
    if stop.reason is StopReason.NON_FINITE_LOSSES:
        raise RuntimeError(
            f"{state.bad_steps} steps in a row had a non-finite loss, so the run stopped after saving a checkpoint "
            f"at step {step}. Lower trainer.learning_rate or check the rewards, then resume with "
            "trainer.resume=auto."
        )
    return stopping


def save_model(state: "TrainState") -> None:
    """The trained model and its tokenizer in RUN_DIR/model."""
    model, accelerator, directory = state.optimization.model, state.accelerator, state.run_dir / "model"
    weights = accelerator.get_state_dict(model)  # every process: FSDP and ZeRO-3 gather the whole weights
    if accelerator.is_main_process:
        accelerator.unwrap_model(model).save_pretrained(directory, state_dict=weights)
        state.run.tokenizer.save_pretrained(directory)
        log.info("Model saved to %s (load it with from_pretrained, or train on from it with model.name_or_path=%s)",
                 directory.resolve(), directory.resolve())
        state.outputs.hooks.on_save(run=state.run, directory=directory)


def build_accelerator(t: DictConfig, run_dir: Path, trackers: list[str]) -> Accelerator:
    """The run's Accelerator; gradient accumulation is left to `Optimization`."""
    # accelerate keeps its settings per process; an earlier run in this process (a sweep run by the basic
    # launcher, a notebook) may have chosen another precision. The process group itself (PartialState) is kept.
    AcceleratorState._reset_state()
    accelerator = Accelerator(
        # Launched as several processes on a machine without CUDA (torchrun, `accelerate launch --multi_gpu`):
        # accelerate joins them over gloo only when told to use the CPU.
        cpu=int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.cuda.is_available(),
        mixed_precision=resolve_mixed_precision(t.mixed_precision),
        log_with=accelerate_trackers(trackers, t, run_dir) or None,
        project_config=ProjectConfiguration(project_dir=str(run_dir), logging_dir=str(run_dir / "trackers")),
    )
    for engine, flag in (("FSDP", "ACCELERATE_USE_FSDP"), ("DeepSpeed", "ACCELERATE_USE_DEEPSPEED")):
        if os.environ.get(flag, "").lower() == "true" and not is_sharded(accelerator) and accelerator.is_main_process:
            log.warning(
                "The accelerate config asks for %s, which accelerate uses only on GPUs (or other accelerators): "
                "this run is plain data parallel (%s) over %d processes instead.",
                engine, accelerator.distributed_type.value, accelerator.num_processes,
            )
    configure_deepspeed(accelerator, t)
    return accelerator


@dataclass
class Optimization:
    """The policy's update: the loss and its gradient on each micro-batch, and the optimizer step once the
    micro-batches of an accumulation are in.

    The accumulation is counted here, not by accelerate: the loss plugins already divide by the accumulation
    steps, as TRL's losses do, and accelerate's own accumulation would divide the loss once more.
    """

    model: torch.nn.Module  # prepared by the accelerator
    optimizer: torch.optim.Optimizer
    scheduler: Any
    accelerator: Accelerator
    policy_loss: PolicyLoss
    gradient_accumulation_steps: int
    steps_per_generation: int
    max_grad_norm: float
    entropy_totals: torch.Tensor | None = None  # (2,) the entropy sum and count of the step so far
    learning_rate: float = math.nan  # the rate the last optimizer step used, which is logged (as TRL logs it)

    def train_on(
        self, micro_batch: dict[str, torch.Tensor], finite: bool, ends_step: bool
    ) -> tuple[ObjectiveOutput, bool, float | None]:
        """The micro-batch's loss and metrics; whether every loss of the step so far was finite on every process
        (else the step is skipped); the gradient norm when this micro-batch ended the step."""
        accelerator, grad_norm = self.accelerator, None
        # Processes exchange gradients once, after the last micro-batch of a step.
        with contextlib.nullcontext() if ends_step else accelerator.no_sync(self.model):
            out = self.policy_loss(
                self.model,
                micro_batch,
                gradient_accumulation_steps=self.gradient_accumulation_steps,
                steps_per_generation=self.steps_per_generation,
                num_processes=accelerator.num_processes,
            )
            # Decided by every process together: one that skipped its backward alone would desync DDP.
            finite = finite and bool(accelerator.gather(torch.isfinite(out.loss.detach()).reshape(1)).all())
            if finite:
                accelerator.sync_gradients = ends_step  # DeepSpeed's backward steps its optimizer when True
                accelerator.backward(out.loss)
        if out.entropy_totals is not None:
            self.entropy_totals = out.entropy_totals + (0 if self.entropy_totals is None else self.entropy_totals)
        if ends_step:
            self.learning_rate = self.scheduler.get_last_lr()[0]  # before the scheduler moves on to the next step's
            if finite:
                grad_norm = float(accelerator.clip_grad_norm_(self.model.parameters(), self.max_grad_norm))
                self.optimizer.step()
                self.scheduler.step()
            self.optimizer.zero_grad()
            self._end_entropy_window(out)
        return out, finite, grad_norm

    @property
    def entropy_control(self):
        return self.policy_loss.objective.entropy_control

    def _end_entropy_window(self, out: ObjectiveOutput) -> None:
        """Adaptive entropy control's update, once per optimizer step as TRL's (skipped steps too), from the mean
        entropy of the step's trained tokens on every process; the coefficient is logged as TRL logs it."""
        control = self.entropy_control
        if self.entropy_totals is not None and self.policy_loss.objective.algorithm.use_adaptive_entropy:
            entropy_sum, count = self.accelerator.reduce(self.entropy_totals, reduction="sum").tolist()
            control.update(entropy_sum / max(count, 1.0))
        self.entropy_totals = None
        if control.enabled:
            out.metrics["entropy_coef"] = torch.tensor(control.coef, device=self.accelerator.device)


def check_processes(cfg: DictConfig, generation_batch_size: int, num_processes: int) -> None:
    """Each process generates, scores and trains on whole groups of its own prompts."""
    num_generations = cfg.generation.num_generations
    if generation_batch_size % num_generations:
        raise ConfigError(
            f"Each process's generation batch holds per_device_train_batch_size x steps_per_generation = "
            f"{generation_batch_size} completions, which is not a multiple of generation.num_generations="
            f"{num_generations}: change one of them (every process generates whole groups of its own prompts)."
        )
    if num_processes > 1 and (cfg.rollouts.save or cfg.rollouts.replay):
        raise ConfigError(
            "rollouts.save and rollouts.replay record and replay one process's generation batches: run them with "
            f"one process (this run has {num_processes})."
        )


def steps_in_epochs(cfg: DictConfig, num_prompts: int, prompts_per_generation: int) -> int:
    """TRL's `max_steps=-1`: the optimizer steps that `num_train_epochs` passes over the prompts take.

    A generation batch draws `prompts_per_generation` prompts and is trained on for steps_per_generation x
    num_iterations micro-batches; an epoch is the whole generation batches the dataset fills.
    """
    t, algo = cfg.trainer, cfg.algorithm
    steps_per_generation = algo.steps_per_generation or t.gradient_accumulation_steps
    micro_batches = num_prompts // prompts_per_generation * steps_per_generation * algo.num_iterations
    steps_per_epoch = max(micro_batches // t.gradient_accumulation_steps, 1)
    steps = math.ceil(t.num_train_epochs * steps_per_epoch)
    log.info(
        "trainer.max_steps=-1: %g epochs of %d prompts (%d optimizer steps each) make %d steps",
        t.num_train_epochs, num_prompts, steps_per_epoch, steps,
    )
    return steps


def outcome(run_dir: Path) -> str:
    """The final reward and eval reward a finished run reports, in words."""
    run = load_run(run_dir, run_dir)
    said = [f"final reward {run.final_reward:.3f} (the last tenth of logged steps)"]
    if not math.isnan(run.eval_reward):
        said.append(f"eval reward {run.eval_reward:.3f}")
    return ", ".join(said)


class StopReason(enum.Enum):
    """Why a run stops before max_steps, having saved a checkpoint to resume from."""

    SIGINT = "SIGINT"
    SIGTERM = "SIGTERM"
    NON_FINITE_LOSSES = "non-finite losses"


class Stopped(KeyboardInterrupt):
    """Raised by `train` when a signal stopped the run: neither finished nor failed, but saved to be resumed. A
    KeyboardInterrupt, so that what stops on Ctrl-C (a notebook, a script's loop over runs) stops on it too.
    `exit_code` is the shell's for a process that a signal ended, 128 + its number: 130 for SIGINT, 143 for SIGTERM."""

    def __init__(self, reason: StopReason, message: str):
        super().__init__(message)
        self.exit_code = 128 + signal.Signals[reason.value]


class StopRequest:
    """SIGINT or SIGTERM: finish the step under way, save a checkpoint and stop, instead of dying mid-step. A second
    signal stops at once, without saving, for a run that must not wait for its step to end."""

    def __init__(self):
        self.reason: StopReason | None = None
        self.previous = {sig: signal.signal(sig, self._request) for sig in (signal.SIGINT, signal.SIGTERM)}

    def _request(self, signum, frame):
        reason = StopReason(signal.Signals(signum).name)
        if self.reason in (StopReason.SIGINT, StopReason.SIGTERM):  # asked a second time
            self.restore()  # a third signal meets the handlers the run started with
            raise Stopped(
                reason, f"A second {reason.value} stopped the run at once, without saving the step under way; "
                "trainer.resume=auto goes on from its last checkpoint."
            )
        self.reason = reason
        log.warning("%s: stopping after the step under way, once it is saved (send it again to stop at once)",
                    reason.value)

    def restore(self):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


@dataclass
class SideOutputs:
    """What a run writes and listens to besides the core path, in one place; `close` ends them however the run
    ends. The run lock (grpo_kit/outputs/plugin_lock.py) is written by `setup`, checkpoints by `save_step`, rollouts recorded and
    replayed by the `Rollout`."""

    plugin_manager: Any
    plugins: list  # the metrics loggers (JSONL, console, trackers) and hook plugins, registered for the run
    console: ConsoleLogger
    scorer: Scorer  # its reward workers are stopped at the end
    stop: StopRequest  # SIGINT or SIGTERM: save and stop after the step under way
    generation: Any = None  # the generation backend, once started
    evaluator: Evaluator | None = None  # eval sets, when configured
    samples: SampleLog | None = None  # samples.jsonl and samples.html, on the main process

    @property
    def hooks(self):
        """Every registered plugin's hooks: on_step_end, on_log, on_save, ..."""
        return self.plugin_manager.hook

    def close(self) -> None:
        if self.generation is not None:
            self.generation.close()
        self.stop.restore()
        self.console.close()
        self.scorer.close()
        for plugin in self.plugins:
            if self.plugin_manager.is_registered(plugin):
                self.plugin_manager.unregister(plugin)


@dataclass
class TrainState:
    """Everything a restart needs, in one place: a checkpoint is `state_dict()`, and resuming is
    `load_state_dict()` of it, so that a resumed run goes on bit for bit as if it had never stopped."""

    model: torch.nn.Module  # unwrapped
    optimizer: torch.optim.Optimizer
    scheduler: Any
    sampler: PromptSampler
    moving_reference: torch.nn.Module | None  # the reference model when algorithm.sync_ref_model moves it
    replay: RolloutReplay | None
    recorder: RolloutRecorder | None
    config: dict  # the resolved config, to refuse a resume under other settings
    accelerator: Accelerator  # which process this is, and how to gather every process's own parts
    # What the loop runs with, built by `setup` and not saved: a resumed run builds them again.
    cfg: DictConfig
    run_dir: Path
    run: Run  # what hooks and plugins see of the run
    rollout: Rollout  # generate -> score -> advantages
    references: "ReferenceQuantities"  # old, reference and rollout-correction log-probs
    optimization: Optimization  # forward -> loss -> backward -> optimizer step
    generation: Any  # the generation backend, sent the weights after each step
    split_batch: Callable[[dict], list[dict]]  # a generation batch into micro-batches (grpo_kit/training/batches.py)
    prompts_per_generation: int  # this process's prompts in a generation batch
    outputs: "SideOutputs"
    step: int = 0  # optimizer steps done
    micro_step: int = 0  # micro-batches trained on so far
    micro_batches: list[dict] = field(default_factory=list)  # the generation batch still being trained on
    rollout_metrics: dict[str, float] = field(default_factory=dict)  # that batch's metrics
    window: defaultdict[str, list[float]] = field(default_factory=lambda: defaultdict(list))  # since the last log
    bad_steps: int = 0  # non-finite steps in a row (not saved: a resumed run counts again)
    num_tokens: int = 0  # prompt and completion tokens generated for training so far, every process's
    session_start: tuple[float, int] = (0.0, 0)  # when training began (or resumed), and num_tokens then

    def state_dict(self) -> dict:
        """The checkpoint; every process calls it, since it gathers what differs between processes."""
        sharded = is_sharded(self.accelerator)  # then accelerator.save_state writes the model and optimizer
        return {
            "model": None if sharded else self.model.state_dict(),
            "optimizer": None if sharded else self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "sampler": self.sampler.state(),
            "reference": (  # gathered whole under FSDP2 and ZeRO-3
                None if self.moving_reference is None else self.accelerator.get_state_dict(self.moving_reference)
            ),
            "replay_position": None if self.replay is None else self.replay.count,
            "recorded": None if self.recorder is None else self.recorder.count,
            "config": self.config,
            "step": self.step,
            "micro_step": self.micro_step,
            "rollout_metrics": self.rollout_metrics,
            "window": dict(self.window),
            "num_tokens": self.num_tokens,
            "entropy_control": self.optimization.entropy_control.state_dict(),
            # Each process's own generation batch and random generators, by process index.
            "processes": gather_object([{"micro_batches": to_cpu(self.micro_batches), "random": random_states()}]),
        }

    def progress(self) -> dict:
        """What a step changes before its optimizer step, to go back to the step's start (`rewind`)."""
        return {
            "sampler": self.sampler.state(),
            "micro_step": self.micro_step,
            "micro_batches": list(self.micro_batches),  # a micro-batch is replaced, never changed in place
            "rollout_metrics": self.rollout_metrics,
            "window": {name: list(values) for name, values in self.window.items()},
            "num_tokens": self.num_tokens,
            "replay_position": None if self.replay is None else self.replay.count,
            "recorded": None if self.recorder is None else self.recorder.count,
            "random": random_states(),
        }

    def rewind(self, progress: dict) -> None:
        self.sampler.restore(progress["sampler"])
        self.micro_step, self.micro_batches = progress["micro_step"], progress["micro_batches"]
        self.num_tokens = progress["num_tokens"]
        self.rollout_metrics = progress["rollout_metrics"]
        self.window.clear()
        self.window.update(progress["window"])
        if self.replay is not None:
            self.replay.count = progress["replay_position"]
        if self.recorder is not None:
            self.recorder.count = progress["recorded"]
        restore_random_states(progress["random"])

    def load_state_dict(self, state: dict) -> None:
        if len(state["processes"]) != self.accelerator.num_processes:
            raise ConfigError(
                f"The checkpoint was written by {len(state['processes'])} processes and this run has "
                f"{self.accelerator.num_processes}: resume with as many processes, for the run to go on exactly."
            )
        own = state["processes"][self.accelerator.process_index]
        if state["model"] is not None:  # otherwise accelerator.load_state has loaded them
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.sampler.restore(state["sampler"])
        if self.moving_reference is not None:
            load_whole_weights(self.accelerator, self.moving_reference, state["reference"])
        if self.replay is not None:
            self.replay.count = state["replay_position"]
        if self.recorder is not None:
            self.recorder.count = state["recorded"]
        self.step, self.micro_step, self.num_tokens = state["step"], state["micro_step"], state["num_tokens"]
        device = self.accelerator.device
        self.micro_batches = [{name: tensor.to(device) for name, tensor in batch.items()} for batch in own["micro_batches"]]
        self.rollout_metrics = state["rollout_metrics"]
        self.window.clear()
        self.window.update(state["window"])
        self.optimization.entropy_control.load_state_dict(state["entropy_control"])
        restore_random_states(own["random"])


def to_cpu(micro_batches: list[dict]) -> list[dict]:
    return [{name: tensor.cpu() for name, tensor in batch.items()} for batch in micro_batches]


def save_step(state: TrainState, weights_only: bool = False) -> None:
    """A checkpoint of `state.step`, written by every process together: the whole TrainState, or the model's
    weights only."""
    accelerator, run_dir, keep = state.accelerator, state.run_dir, state.cfg.trainer.save_total_limit
    if weights_only:
        model = state.optimization.model
        weights = accelerator.get_state_dict(model)  # every process: FSDP and ZeRO-3 gather the whole weights
        write = functools.partial(
            write_weights, model=accelerator.unwrap_model(model), weights=weights, tokenizer=state.run.tokenizer
        )
    else:
        checkpoint_state = state.state_dict()  # on every process: it gathers their own parts
        parts = None
        if is_sharded(accelerator):  # every process writes its own part of the weights and optimizer state
            parts = run_dir / CHECKPOINTS / f".parts-{state.step:06d}"
            accelerator.save_state(parts)
            accelerator.wait_for_everyone()
        write = functools.partial(write_state, state=checkpoint_state, parts=parts)
    if accelerator.is_main_process:
        save_checkpoint(run_dir, state.step, write, keep=keep)
    accelerator.wait_for_everyone()


def saved_and_stopped(error: GenerationUnavailable, state: TrainState) -> GenerationUnavailable:
    """Save the last whole step; the error to stop with, saying how to resume."""
    save_step(state)
    return GenerationUnavailable(
        f"{error}\nA checkpoint of step {state.step} is saved; once generation works again, resume with:\n"
        f"  {resume_command(state.run_dir)}"
    )


@dataclass
class ReferenceQuantities:
    """What a micro-batch needs besides its own forward pass: old, reference and rollout-correction terms."""

    objective: Objective
    policy_loss: PolicyLoss  # its log-probs are the trained ones, so old and reference log-probs come from it too
    reference: Callable | None  # the frozen reference model, when algorithm.beta > 0
    autocast: Callable  # the mixed-precision context the policy's forward passes run in
    off_policy: bool
    corrects_rollouts: bool = True  # False: the rollout correction is off for this run's sampler (compatibility.py)

    @property
    def wants_sampling_logps(self) -> bool:
        return self.corrects_rollouts and self.objective.correction.level is not None

    @torch.no_grad()
    def add(self, policy, micro_batch: dict[str, torch.Tensor], moved: bool = True) -> None:
        """`moved`: the policy will have taken an optimizer step before the micro-batch is first trained on.
        Otherwise its old log-probs are those its first training pass computes (the trainer keeps them)."""
        sampling = micro_batch.get("sampling_per_token_logps")
        corrected = sampling is not None and self.wants_sampling_logps
        if (self.off_policy and moved) or corrected:
            micro_batch["old_per_token_logps"], _ = self.policy_loss.logps(policy, micro_batch)
        if corrected:
            micro_batch["importance_sampling_ratio"] = self.objective.rollout_correction(
                micro_batch["old_per_token_logps"], sampling, loss_mask(micro_batch)
            )
        if self.reference is not None:
            with self.autocast():
                micro_batch["ref_per_token_logps"], _ = self.policy_loss.logps(self.reference, micro_batch)


@torch.no_grad()
def generate_batch(rollout, run, references, model, num_prompts, accelerator, split_batch, moved):
    """A scored generation batch, cut into micro-batches by `split_batch` (grpo_kit/training/batches.py), with their
    reference quantities; `moved[i]`: whether the policy moves before micro-batch i is first trained on."""
    batch, metrics = rollout(run, num_prompts)
    batch = {name: tensor.to(accelerator.device) for name, tensor in batch.items()}
    # Token normalisers (dapo, cispo) divide by the active tokens of the whole batch on every process.
    batch["num_items_in_batch"] = accelerator.gather(loss_mask(batch).sum()).sum()
    micro_batches = split_batch(batch)
    for micro_batch, policy_moved in zip(micro_batches, moved):
        references.add(model, micro_batch, policy_moved)
    if "importance_sampling_ratio" in micro_batches[0]:
        metrics |= sampler_mismatch(micro_batches, accelerator)
    return micro_batches, metrics


def sampler_mismatch(micro_batches: list[dict], accelerator) -> dict[str, float]:
    """How far the sampler's log-probs are from the trainer's, and the rollout correction's ratio, over the whole
    generation batch (TRL's `sampling/` metrics)."""
    mask = torch.cat([loss_mask(mb) for mb in micro_batches]).bool()  # (N, T)
    ratio = torch.cat([mb["importance_sampling_ratio"] for mb in micro_batches])  # (N, T) or (N, 1)
    ratio = ratio[mask] if ratio.shape == mask.shape else ratio.view(-1)  # active tokens, or sequences
    difference = torch.cat([mb["old_per_token_logps"] - mb["sampling_per_token_logps"] for mb in micro_batches])
    difference = difference[mask].abs().float()
    ratio = ratio.float()
    # Each process's sums, counts and extremes, gathered: processes hold different numbers of tokens.
    local = torch.tensor([
        difference.sum().item(), difference.max().item() if difference.numel() else 0.0, difference.numel(),
        ratio.sum().item(), ratio.min().item() if ratio.numel() else math.inf, ratio.max().item() if ratio.numel() else 0.0, ratio.numel(),
    ], device=accelerator.device)
    every = accelerator.gather(local.unsqueeze(0))  # (processes, 7)
    return {
        "sampling/sampling_logp_difference/mean": (every[:, 0].sum() / every[:, 2].sum().clamp(min=1)).item(),
        "sampling/sampling_logp_difference/max": every[:, 1].max().item(),
        "sampling/importance_sampling_ratio/mean": (every[:, 3].sum() / every[:, 6].sum().clamp(min=1)).item(),
        "sampling/importance_sampling_ratio/min": every[:, 4].min().item(),
        "sampling/importance_sampling_ratio/max": every[:, 5].max().item(),
    }


def sample_columns(rollout):
    scored, advantages = rollout.last
    names = list(rollout.scorer.rewards)
    return (
        scored.prompts, scored.completions, scored.rewards_per_func, names, advantages, scored.generated,
        scored.extra_columns,
    )


def tokens_seen(scored: ScoredBatch, accelerator) -> int:
    """The prompt and completion tokens of a generation batch on every process, as TRL counts them for its
    num_tokens: each prompt's own length, and the tokens the model wrote (tool output left out)."""
    generated = scored.generated
    written = generated.completion_mask if generated.tool_mask is None else generated.completion_mask * generated.tool_mask
    local = sum(len(ids) for ids in scored.prompt_ids) + int(written.sum())
    return int(accelerator.gather(torch.tensor([local], device=accelerator.device)).sum())


def token_counts(state: "TrainState") -> dict:
    """TRL's num_tokens, and transformers' train_tokens_per_second: the tokens since training began (a resumed run:
    since it resumed) over the seconds since."""
    started, tokens_then = state.session_start
    return {
        "num_tokens": state.num_tokens,
        "train_tokens_per_second": (state.num_tokens - tokens_then) / (time.perf_counter() - started),
    }


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
