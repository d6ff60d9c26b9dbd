"""Everything the loop needs, built and checked before the model is loaded where it can be: a `Session` (what runs
the steps, never saved) and a `TrainState` (what a restart needs), resumed from a checkpoint when
`trainer.resume` finds one."""

import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from accelerate.utils import ProjectConfiguration, set_seed
from omegaconf import DictConfig, OmegaConf

from grpo_kit.config.compatibility import corrects_rollouts
from grpo_kit.config.compose import complete, options
from grpo_kit.config.secrets import redacted
from grpo_kit.contract.eos import eos_token_ids
from grpo_kit.contract.errors import ConfigError
from grpo_kit.contract.pipeline import Run
from grpo_kit.model.loading import load_model
from grpo_kit.model.logprobs import unwrapped
from grpo_kit.model.packing import use_packing
from grpo_kit.model.precision import resolve_mixed_precision
from grpo_kit.model.sharding import (
    build_reference,
    check_moving_reference,
    configure_deepspeed,
    prepare_reference,
    state_is_sharded,
)
from grpo_kit.model.threads import use_torch_threads
from grpo_kit.objective.objective import build_objective
from grpo_kit.objective.policy_loss import build_policy_loss
from grpo_kit.outputs.checkpoints import claim_run_directory
from grpo_kit.outputs.loggers import ConsoleLogger, JsonlLogger
from grpo_kit.outputs.plugin_lock import record_session
from grpo_kit.outputs.samples import SampleLog
from grpo_kit.outputs.trackers import TrackerLogger, accelerate_trackers, check_trackers
from grpo_kit.plugins.registry import Registry
from grpo_kit.rollout.checks import check_model_path, check_prompt_lengths, check_reward_columns
from grpo_kit.rollout.evaluation import Evaluator, load_eval_sets
from grpo_kit.rollout.prompts import PromptSampler, load_prompts, use_chat_template_kwargs
from grpo_kit.rollout.replay import RolloutRecorder, RolloutReplay
from grpo_kit.rollout.rollout import Rollout
from grpo_kit.rollout.scoring import Scorer, at_step, reward_trainer_state
from grpo_kit.training.asynchronous import check_asynchronous, generate_ahead
from grpo_kit.training.batches import GenerationBatches, group_by_length, token_budget
from grpo_kit.training.builders import build_advantage, build_custom_rollout, build_hooks, build_rewards, build_tool_use
from grpo_kit.training.lifecycle import Resources, StopRequest
from grpo_kit.training.optimization import Optimization
from grpo_kit.training.optimizers import build_optimizer, build_scheduler, check_optimization
from grpo_kit.training.saving import resume
from grpo_kit.training.state import TrainState
from grpo_kit.training.vision import image_prompts

log = logging.getLogger(__name__)


@dataclass
class Session:
    """What runs the steps of one run in this process, built again by a resumed run: nothing of it is saved."""

    cfg: DictConfig
    run_dir: Path
    accelerator: Accelerator
    run: Run  # what hooks and plugins see of the run
    batches: GenerationBatches  # generate -> score -> advantages -> old and reference log-probs
    optimization: Optimization  # forward -> loss -> backward -> optimizer step
    resources: Resources  # the generation backend, reward workers, loggers, hooks, signals: closed at the end
    prompts_per_generation: int  # this process's prompts in a generation batch
    reward_trainer_state: object  # the trainer_state rewards receive, as TRL hands its own
    started: tuple[float, int] = (0.0, 0)  # when training began (or resumed), and num_tokens then


def setup(cfg: DictConfig, run_dir: Path, registry: Registry) -> tuple[Session, TrainState]:
    """The run's session and state; the session's resources must be closed however the run ends."""
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
    check_asynchronous(cfg, generation)
    hook_plugins = build_hooks(cfg, registry)

    t, algo = cfg.trainer, cfg.algorithm
    num_generations = cfg.generation.num_generations
    steps_per_generation = algo.steps_per_generation or t.gradient_accumulation_steps
    by_length = group_by_length(cfg, objective.loss, steps_per_generation)
    budget = token_budget(cfg, objective.loss, steps_per_generation)
    trackers = check_trackers(list(t.report_to))
    accelerator = build_accelerator(t, run_dir, trackers)
    generation_batch_size = t.per_device_train_batch_size * steps_per_generation  # completions, this process
    check_processes(cfg, generation_batch_size, accelerator.num_processes)
    check_moving_reference(accelerator, cfg)
    prompts_per_generation = generation_batch_size // num_generations  # this process's whole groups
    replay = RolloutReplay(cfg.rollouts.replay, num_generations, generation_batch_size) if cfg.rollouts.replay else None
    check_model_path(cfg.model.name_or_path)
    prompts = load_prompts(cfg.data)
    eval_sets = load_eval_sets(cfg.eval, cfg.data)
    every_prompt_set = [prompts, *eval_sets.values()]
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
        (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(redacted(cfg))))
    set_seed(cfg.seed)

    images = image_prompts(cfg, every_prompt_set, generation)  # reads every image now: a bad one fails here
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
    if policy_loss.router_aux_loss_coef != 0.0 and budget.max_tokens is not None:
        raise ConfigError(
            "trainer.max_tokens_per_micro_batch would change the gradient of this run's steps, because the router "
            "load-balancing loss of this mixture-of-experts model is computed over each micro-batch's tokens. Leave "
            "it null, or set algorithm.router_aux_loss_coef=0."
        )
    if budget.packing:
        use_packing(model)  # the first packed pass checks that the model keeps packed sequences apart
    eos = eos_token_ids(model, tokenizer)  # every backend, the tool loop and custom rollouts end completions at these
    for dataset in every_prompt_set:
        check_prompt_lengths(
            dataset,
            tokenizer,
            cfg.generation.max_completion_length,
            getattr(model.config, "max_position_embeddings", None),
        )
    reference = build_reference(cfg, model, accelerator) if algo.beta != 0.0 else None
    if reference is not None and budget.packing:
        use_packing(unwrapped(reference))
    sampler = PromptSampler(prompts, cfg.seed, cfg.data.shuffle, accelerator.process_index, accelerator.num_processes)
    optimizer = build_optimizer(t, model)
    scheduler = build_scheduler(t, optimizer, max_steps)
    # The scheduler stays unprepared: accelerate would step it once per process, TRL steps it once per step.
    model, optimizer = accelerator.prepare(model, optimizer)
    reference = prepare_reference(reference, accelerator)
    optimization = Optimization(model, optimizer, scheduler, accelerator, policy_loss, t.max_grad_norm, budget=budget)

    # The trainer_state rewards receive, as TRL hands its own; `at_step` moves it on after each step.
    prompts_per_step = (
        prompts_per_generation
        * accelerator.num_processes
        * t.gradient_accumulation_steps
        / (steps_per_generation * algo.num_iterations)
    )
    trainer_state = reward_trainer_state(
        max_steps,
        max_steps * prompts_per_step / len(prompts),
        logging_steps=t.logging_steps,
        save_steps=t.save_steps,
        train_batch_size=t.per_device_train_batch_size,
        is_local_process_zero=accelerator.is_local_main_process,
        is_world_process_zero=accelerator.is_main_process,
    )
    console = ConsoleLogger()
    resources = Resources(
        registry.plugin_manager,
        [JsonlLogger(), console, *([TrackerLogger()] if trackers else []), *hook_plugins],
        console,
        Scorer(rewards, timeout=t.reward_timeout, workers=t.reward_workers, trainer_state=trainer_state),
        StopRequest(),
    )
    try:
        generation.start(model, tokenizer, accelerator)
        resources.generation = generation  # from here on it is closed however the run ends
        for plugin in resources.plugins:
            resources.plugin_manager.register(plugin)
        # The sampler's log-probs are asked for where a rollout correction is selected and applies to this sampler.
        corrected = corrects_rollouts(cfg, registry) and objective.correction.level is not None
        rollout = Rollout(
            sampler,
            generation,
            resources.scorer,
            reward_weights,
            advantage,
            tokenizer,
            num_generations,
            algo.mask_truncated_completions,
            resources.hooks,
            accelerator,
            eos_token_ids=eos,
            with_logprobs=corrected,
            replay=replay,
            recorder=RolloutRecorder(run_dir) if cfg.rollouts.save else None,
            tool_use=build_tool_use(cfg, registry, tokenizer, generation, accelerator, eos),
            custom=build_custom_rollout(cfg, registry),
            images=images,
        )
        batches = GenerationBatches(
            rollout,
            policy_loss,
            reference,
            accelerator,
            steps_per_generation,
            t.gradient_accumulation_steps,
            algo.num_iterations,
            cfg.generation.max_completion_length,
            by_length,
            corrected,
            budget,
        )
        session = Session(
            cfg,
            run_dir,
            accelerator,
            Run(cfg, run_dir, accelerator, model, tokenizer, max_steps, processor=images.processor if images else None),
            batches,
            optimization,
            resources,
            prompts_per_generation,
            trainer_state,
        )
        state = TrainState(
            model=accelerator.unwrap_model(model),
            optimizer=optimizer,
            scheduler=scheduler,
            sampler=sampler,
            entropy_control=objective.entropy_control,
            config=redacted(cfg),  # what the checkpoints' config.json holds
            moving_reference=reference if algo.sync_ref_model else None,
            replay=replay,
            recorder=rollout.recorder,
        )
        if checkpoint is not None:
            resume(session, state, checkpoint)
            at_step(trainer_state, state.step)
        if algo.max_staleness:  # from here on generation goes through the worker, which closes the backend
            resources.generation = generate_ahead(
                cfg, rollout, state, prompts_per_generation, batches.micro_steps_per_batch
            )
        if eval_sets:
            resources.evaluator = Evaluator(
                eval_sets,
                rollout,
                cfg.eval,
                cfg.seed,
                max_steps,
                accelerator,
                stopping=lambda: resources.stop.reason is not None,
            )
        if t.sample_every > 0 and accelerator.is_main_process:
            resources.samples = SampleLog(run_dir, every=t.sample_every, max_rows=t.sample_rows)
        if accelerator.is_main_process:  # the run lock: what trains from the step the run starts or resumes at
            record_session(run_dir, registry, cfg, state.step)
    except BaseException:
        resources.close()
        raise
    return session, state


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
        if (
            os.environ.get(flag, "").lower() == "true"
            and not state_is_sharded(accelerator)
            and accelerator.is_main_process
        ):
            log.warning(
                "The accelerate config asks for %s, which accelerate uses only on GPUs (or other accelerators): "
                "this run is plain data parallel (%s) over %d processes instead.",
                engine,
                accelerator.distributed_type.value,
                accelerator.num_processes,
            )
    configure_deepspeed(accelerator, t)
    return accelerator


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
        t.num_train_epochs,
        num_prompts,
        steps_per_epoch,
        steps,
    )
    return steps
