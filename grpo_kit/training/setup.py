"""Everything the loop needs, built and checked before the model is loaded where it can be: a `Session` (what runs
the steps, never saved) and a `TrainState` (what a restart needs), resumed from a checkpoint when
`trainer.resume` finds one.

`setup` reads as the order things are built in, each by a builder of its own: the plugins, the accelerator, the
prompts, the batch plan (training/plan.py), the policy and its reference, the optimization, the outputs and the
run's resources, then the rollout and its generation batches.
"""

import logging
import os
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import datasets
import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from accelerate.utils import InitProcessGroupKwargs, ProjectConfiguration, set_seed
from omegaconf import DictConfig, OmegaConf

from grpo_kit.config.compose import complete, options
from grpo_kit.config.secrets import redacted
from grpo_kit.contract.eos import eos_token_ids
from grpo_kit.contract.errors import ConfigError
from grpo_kit.contract.pipeline import Run
from grpo_kit.model.fast.compiled import use_compiled_passes
from grpo_kit.model.loading import load_model
from grpo_kit.model.logprobs import unwrapped
from grpo_kit.model.packing import use_packing
from grpo_kit.model.precision import resolve_mixed_precision, use_tf32
from grpo_kit.model.sharding import (
    build_reference,
    check_moving_reference,
    configure_deepspeed,
    prepare_reference,
    state_is_sharded,
)
from grpo_kit.model.threads import use_torch_threads
from grpo_kit.objective.objective import Objective, build_objective
from grpo_kit.objective.policy_loss import PolicyLoss, build_policy_loss
from grpo_kit.objective.sampler_correction import SamplerCorrection
from grpo_kit.objective.shadows import build_shadows
from grpo_kit.outputs.checkpoints import claim_run_directory
from grpo_kit.outputs.completion_tables import CompletionTables
from grpo_kit.outputs.hub import HubPush, open_hub
from grpo_kit.outputs.loggers import ConsoleLogger, JsonlLogger
from grpo_kit.outputs.plugin_lock import record_session
from grpo_kit.outputs.samples import SampleLog
from grpo_kit.outputs.trackers import TrackerLogger, accelerate_trackers, check_trackers
from grpo_kit.plugins.registry import Registry
from grpo_kit.rollout.ahead import GenerationAhead
from grpo_kit.rollout.checks import check_model_path, check_prompt_lengths, check_reward_columns
from grpo_kit.rollout.evaluation import Evaluator, load_eval_sets
from grpo_kit.rollout.images import ImagePrompts
from grpo_kit.rollout.prompts import PromptSampler, load_prompts, use_chat_template_kwargs
from grpo_kit.rollout.replay import RolloutRecorder, RolloutReplay
from grpo_kit.rollout.rollout import Rollout
from grpo_kit.rollout.scoring import Scorer, reward_trainer_state
from grpo_kit.training.asynchronous import check_asynchronous, check_forced_staleness, start_generating_ahead
from grpo_kit.training.batches import GenerationBatches, group_by_length, token_budget
from grpo_kit.training.builders import build_advantage, build_custom_rollout, build_hooks, build_rewards, build_tool_use
from grpo_kit.training.instruments import build_instruments
from grpo_kit.training.lifecycle import Resources, StopRequest
from grpo_kit.training.optimization import Optimization
from grpo_kit.training.optimizers import build_optimizer, build_scheduler, check_optimization
from grpo_kit.training.plan import BatchPlan
from grpo_kit.training.saving import resume
from grpo_kit.training.staleness import lagged_weights
from grpo_kit.training.state import TrainState
from grpo_kit.training.token_budget import TokenBudget
from grpo_kit.training.vision import image_prompts

log = logging.getLogger(__name__)


@dataclass
class Session:
    """What runs the steps of one run in this process, built again by a resumed run: nothing of it is saved."""

    cfg: DictConfig
    run_dir: Path
    accelerator: Accelerator
    run: Run  # what hooks and plugins see of the run
    plan: BatchPlan  # the batch sizes: completions per micro-batch, micro-batches per step and per generation
    batches: GenerationBatches  # generate -> score -> advantages -> old and reference log-probs
    optimization: Optimization  # forward -> loss -> backward -> optimizer step
    resources: Resources  # the generation backend, reward workers, loggers, hooks, signals: closed at the end
    started: tuple[float, int] = (0.0, 0)  # when training began (or resumed), and num_tokens then


@dataclass
class Plugins:
    """The run's plugins, built before the model is loaded, so that a bad name or option costs nothing."""

    objective: Objective
    policy_loss: PolicyLoss  # the plain, chunked, tiled or Liger forward pass and loss
    correction: SamplerCorrection  # the rollout correction, when one applies to this run's sampler
    advantage: Any
    rewards: dict
    reward_weights: torch.Tensor  # (K,)
    generation: Any
    hooks: list


@dataclass
class Prompts:
    """The prompts to train on and to evaluate on, their reward columns checked."""

    train: datasets.Dataset
    eval_sets: dict[str, datasets.Dataset]
    sampler: PromptSampler  # this process's draws from the training prompts

    @property
    def every_set(self) -> list[datasets.Dataset]:
        return [self.train, *self.eval_sets.values()]


@dataclass
class Policy:
    """The policy, its tokenizer and reference, and what follows from the model: EOS ids, how batches are laid out."""

    model: Any
    tokenizer: Any
    reference: Any  # the frozen reference model, when algorithm.beta > 0
    eos: list[int]  # every backend, the tool loop and custom rollouts end completions at these
    images: ImagePrompts | None  # a vision-language policy's prompt renderer
    by_length: bool  # trainer.group_by_length, resolved
    budget: TokenBudget  # trainer.max_tokens_per_micro_batch and trainer.packing


def setup(cfg: DictConfig, run_dir: Path, registry: Registry) -> tuple[Session, TrainState]:
    """The run's session and state; the session's resources must be closed however the run ends."""
    cfg = complete(cfg, registry)
    checkpoint = claim_run_directory(run_dir, cfg)  # refuses before anything is written
    if cfg.trainer.resume and checkpoint is None:
        log.info("No checkpoint in %s: starting from step 0", run_dir)
    plugins = build_plugins(cfg, registry)
    trackers, hub = check_trackers(list(cfg.trainer.report_to)), open_hub(cfg, run_dir)  # the Hub before the model
    accelerator = build_accelerator(cfg.trainer, run_dir, trackers)
    check_moving_reference(accelerator, cfg)
    check_recording(cfg, accelerator.num_processes)
    check_model_path(cfg.model.name_or_path)
    prompts = load_checked_prompts(cfg, registry, plugins.rewards, accelerator)
    plan = BatchPlan.of(cfg, accelerator.num_processes, len(prompts.train))
    replay = cfg.rollout_files.replay
    replay = RolloutReplay(replay, plan.num_generations, plan.generation_batch_size) if replay else None
    check_optimization(cfg.trainer, accelerator.device, plan.max_steps)
    write_run_config(cfg, run_dir, accelerator, plan)
    set_seed(cfg.seed)

    policy = build_policy(cfg, plugins, prompts, plan, accelerator)
    optimization = build_optimization(cfg.trainer, policy, plugins.policy_loss, plan, accelerator)
    optimization.instruments = build_instruments(
        plugins.objective,
        plugins.policy_loss.shadows,
        cfg.diagnostics,
        cfg.eval.correct_threshold,
        policy.model,
        accelerator,
    )
    resources = build_resources(cfg, registry, plugins, plan, accelerator, trackers, len(prompts.train), hub)
    try:
        plugins.generation.start(policy.model, policy.tokenizer, accelerator)
        # The backend as the trainer sees it, from here on closed however the run ends: itself, or with
        # algorithm.max_staleness a worker that generates batches ahead with it (docs/async.md).
        resources.generation = plugins.generation
        if cfg.algorithm.max_staleness:
            resources.generation = GenerationAhead(plugins.generation, prompts.sampler, cfg.algorithm.max_staleness)
        for plugin in resources.plugins:
            resources.plugin_manager.register(plugin)
        rollout = build_rollout(cfg, registry, plugins, policy, resources, accelerator, prompts, replay, run_dir)
        lagged = lagged_weights(cfg, accelerator, accelerator.unwrap_model(policy.model))  # forced_staleness's ring
        batches = GenerationBatches(
            rollout,
            plugins.policy_loss,
            policy.model,
            policy.reference,
            accelerator,
            plan,
            cfg.generation.max_completion_length,
            plugins.correction,
            policy.by_length,
            policy.budget,
            lagged,
        )
        processor = policy.images.processor if policy.images else None
        run = Run(cfg, run_dir, accelerator, policy.model, policy.tokenizer, plan.max_steps, processor=processor)
        session = Session(cfg, run_dir, accelerator, run, plan, batches, optimization, resources)
        state = TrainState(
            model=accelerator.unwrap_model(policy.model),
            optimizer=optimization.optimizer,
            scheduler=optimization.scheduler,
            sampler=rollout.sampler,
            entropy_control=plugins.objective.entropy_control,
            config=redacted(cfg),  # what the checkpoints' config.json holds
            moving_reference=policy.reference if cfg.algorithm.sync_ref_model else None,
            replay=rollout.replay,
            recorder=rollout.recorder,
            ahead=rollout.ahead,
            lagged=lagged,
        )
        if checkpoint is not None:
            resume(session, state, checkpoint)
        start_side_workers(session, state, rollout, prompts.eval_sets)
        if accelerator.is_main_process:  # the run lock: what trains from the step the run starts or resumes at
            record_session(run_dir, registry, cfg, state.step)
    except BaseException:
        resources.close()
        raise
    return session, state


def build_plugins(cfg: DictConfig, registry: Registry) -> Plugins:
    objective = build_objective(cfg, registry)
    generation = registry.build("generation", cfg.generation.name, options(cfg.generation))
    check_asynchronous(cfg, generation)
    check_forced_staleness(cfg)
    rewards, reward_weights = build_rewards(cfg, registry)
    return Plugins(
        objective,
        build_policy_loss(cfg, objective, build_shadows(cfg, registry, objective)),
        SamplerCorrection.of(cfg, registry),
        build_advantage(cfg, registry),
        rewards,
        reward_weights,
        generation,
        build_hooks(cfg, registry),
    )


def load_checked_prompts(cfg: DictConfig, registry: Registry, rewards: dict, accelerator: Accelerator) -> Prompts:
    """The training and evaluation prompts, with the columns the rewards read (a rollout plugin may add them), and
    the sampler that draws them."""
    train = load_prompts(cfg.data)
    plugin = registry.build("sampler", cfg.sampler.name, options(cfg.sampler))
    shares = accelerator.process_index, accelerator.num_processes
    sampler = PromptSampler(train, plugin, cfg.seed, cfg.data.shuffle, *shares)
    prompts = Prompts(train, load_eval_sets(cfg.eval, cfg.data), sampler)
    for dataset in prompts.every_set if cfg.rollout is None else ():
        check_reward_columns(rewards, dataset, OmegaConf.to_container(cfg.reward, resolve=True))
    return prompts


def write_run_config(cfg: DictConfig, run_dir: Path, accelerator: Accelerator, plan: BatchPlan) -> None:
    """The run directory's config.yaml (secrets redacted), and the run's first log lines, on the main process."""
    if not accelerator.is_main_process:
        return
    log.info("Run directory: %s", run_dir.resolve())
    if accelerator.num_processes > 1:  # the log is the main process's alone: say that others train too
        log.info("%d processes train this run (%s)", accelerator.num_processes, accelerator.distributed_type.value)
    log.info("%s", plan.describe())
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "error.txt").unlink(missing_ok=True)  # left by an attempt that failed before this one
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(redacted(cfg))))


def build_policy(
    cfg: DictConfig, plugins: Plugins, prompts: Prompts, plan: BatchPlan, accelerator: Accelerator
) -> Policy:
    """The policy and its reference, loaded, with what the model decides: the batches' layout, the EOS ids."""
    t, algo = cfg.trainer, cfg.algorithm
    # What the config alone says against grouping completions by length is refused before the model loads; the
    # model's own load-balancing loss (a mixture of experts) is known once it has.
    loss, steps_per_generation = plugins.objective.loss, plan.steps_per_generation
    group_by_length(cfg, loss, steps_per_generation, algo.router_aux_loss_coef or 0.0)
    token_budget(cfg, loss, steps_per_generation, algo.router_aux_loss_coef or 0.0)
    images = image_prompts(cfg, prompts.every_set, plugins.generation)  # reads every image now: a bad one fails here
    model, tokenizer = load_model(cfg.model, t.gradient_checkpointing_kwargs)
    use_torch_threads(t.torch_threads, model.config)
    use_chat_template_kwargs(tokenizer, OmegaConf.to_container(cfg.data, resolve=True)["chat_template_kwargs"])
    policy_loss = plugins.policy_loss
    policy_loss.use_router_aux_loss(model, algo.router_aux_loss_coef)  # refused here for a model without experts
    by_length = group_by_length(cfg, loss, steps_per_generation, policy_loss.router_aux_loss_coef)
    budget = token_budget(cfg, loss, steps_per_generation, policy_loss.router_aux_loss_coef)
    if budget.packing:
        use_packing(model)  # the first packed pass checks that the model keeps packed sequences apart
    max_positions = getattr(model.config, "max_position_embeddings", None)
    for dataset in prompts.every_set:
        check_prompt_lengths(dataset, tokenizer, cfg.generation.max_completion_length, max_positions)
    reference = build_reference(cfg, model, accelerator) if algo.beta != 0.0 else None
    if t.torch_compile:  # the policy's passes, after the reference was copied from it: the reference's stay plain
        use_compiled_passes(model, t.torch_compile_backend, t.torch_compile_mode)
    if reference is not None and budget.packing:
        use_packing(unwrapped(reference))
    return Policy(model, tokenizer, reference, eos_token_ids(model, tokenizer), images, by_length, budget)


def build_optimization(
    t: DictConfig, policy: Policy, policy_loss: PolicyLoss, plan: BatchPlan, accelerator: Accelerator
) -> Optimization:
    """The optimizer and scheduler of the policy, which this prepares for training (accelerate wraps it, and the
    reference, in place of the plain modules)."""
    optimizer = build_optimizer(t, policy.model)
    scheduler = build_scheduler(t, optimizer, plan.max_steps)
    # The scheduler stays unprepared: accelerate would step it once per process, TRL steps it once per step.
    policy.model, optimizer = accelerator.prepare(policy.model, optimizer)
    policy.reference = prepare_reference(policy.reference, accelerator)
    return Optimization(
        policy.model, optimizer, scheduler, accelerator, policy_loss, t.max_grad_norm, budget=policy.budget
    )


def build_resources(
    cfg: DictConfig,
    registry: Registry,
    plugins: Plugins,
    plan: BatchPlan,
    accelerator: Accelerator,
    trackers: list[str],
    num_prompts: int,
    hub: HubPush | None = None,
) -> Resources:
    """The loggers, hooks, reward workers, signal handling and pushes to the Hub of the run, to be closed however it
    ends."""
    t = cfg.trainer
    trainer_state = reward_trainer_state(  # the trainer_state rewards receive, as TRL hands its own
        plan.max_steps,
        plan.max_steps * plan.prompts_per_step / num_prompts,
        logging_steps=t.logging_steps,
        save_steps=t.save_steps,
        train_batch_size=t.per_device_train_batch_size,
        is_local_process_zero=accelerator.is_local_main_process,
        is_world_process_zero=accelerator.is_main_process,
    )
    console = ConsoleLogger()
    tables = None
    if t.log_completions:
        tables = CompletionTables(accelerator, t.num_completions_to_print, t.log_unique_prompts)
    loggers = [JsonlLogger(), console, *([TrackerLogger()] if trackers else []), *([tables] if tables else [])]
    return Resources(
        registry.plugin_manager,
        [*loggers, *plugins.hooks],
        console,
        Scorer(plugins.rewards, timeout=t.reward_timeout, workers=t.reward_workers, trainer_state=trainer_state),
        StopRequest(),
        hub=hub,
        completion_tables=tables,
    )


def build_rollout(
    cfg: DictConfig,
    registry: Registry,
    plugins: Plugins,
    policy: Policy,
    resources: Resources,
    accelerator: Accelerator,
    prompts: Prompts,
    replay: RolloutReplay | None,
    run_dir: Path,
) -> Rollout:
    """generate -> score -> advantages, over this process's share of the prompts (or replayed rollouts)."""
    num_generations = cfg.generation.num_generations
    return Rollout(
        prompts.sampler,
        resources.generation,
        resources.scorer,
        plugins.reward_weights,
        plugins.advantage,
        policy.tokenizer,
        num_generations,
        cfg.algorithm.mask_truncated_completions,
        resources.hooks,
        accelerator,
        eos_token_ids=policy.eos,
        # The sampler's log-probs, which the correction reads, and forced staleness's KL to the behaviour policy
        with_logprobs=plugins.correction.applies or cfg.algorithm.forced_staleness is not None,
        replay=replay,
        recorder=RolloutRecorder(run_dir) if cfg.rollout_files.save else None,
        tool_use=build_tool_use(cfg, registry, policy.tokenizer, resources.generation, accelerator, policy.eos),
        custom=build_custom_rollout(cfg, registry),
        images=policy.images,
    )


def start_side_workers(session: Session, state: TrainState, rollout: Rollout, eval_sets: dict) -> None:
    """What runs beside the steps: generation ahead (algorithm.max_staleness), evaluation, the sample log."""
    cfg, resources, accelerator = session.cfg, session.resources, session.accelerator
    if rollout.ahead is not None:
        start_generating_ahead(rollout.ahead, rollout, state, session.plan)
    if eval_sets:
        resources.evaluator = Evaluator(
            eval_sets,
            rollout,
            cfg.eval,
            cfg.seed,
            session.plan.max_steps,
            accelerator,
            stopping=lambda: resources.stop.reason is not None,
        )
    if cfg.trainer.sample_every > 0 and accelerator.is_main_process:
        resources.samples = SampleLog(session.run_dir, every=cfg.trainer.sample_every, max_rows=cfg.trainer.sample_rows)


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
        # Other processes wait in a collective while the main one talks to a generation server: TRL's 1800 s, not
        # the process group's 600 s default.
        kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=t.ddp_timeout))],
    )
    use_tf32(t.tf32)
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


def check_recording(cfg: DictConfig, num_processes: int) -> None:
    """rollout_files.save and rollout_files.replay hold one process's generation batches."""
    if num_processes > 1 and (cfg.rollout_files.save or cfg.rollout_files.replay):
        raise ConfigError(
            "rollout_files.save and rollout_files.replay record and replay one process's generation batches: run them "
            f"with one process (this run has {num_processes})."
        )
