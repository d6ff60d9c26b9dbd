"""The training loop, top to bottom: `setup`, then for each optimizer step `train_step` (generate -> score ->
advantages -> log-probs -> loss, backward, optimizer step) and `end_of_step` (hooks, eval, log, checkpoint, stop),
then the final model. docs/grpo_in_one_file.py computes the same step without the plugins.

Batch sizes follow TRL's GRPOTrainer: grpo_kit/training/plan.py computes them once, and grpo_kit/training/batches.py
makes and cuts each generation batch.
"""

import logging
import math
import time
from pathlib import Path

from accelerate.utils.memory import clear_device_cache
from omegaconf import DictConfig

from grpo_kit.contract.errors import GenerationUnavailable
from grpo_kit.model.sharding import mix_into_sharded_reference
from grpo_kit.outputs.checkpoints import release_run_directory
from grpo_kit.plugins.registry import Registry
from grpo_kit.training.lifecycle import Stopped, outcome
from grpo_kit.training.saving import save_model, save_step, saved_and_stopped
from grpo_kit.training.setup import Session, setup
from grpo_kit.training.staleness import current_weights, push_weights
from grpo_kit.training.staleness_metrics import record_staleness
from grpo_kit.training.state import TrainState
from grpo_kit.training.window import add_micro_batch, summarise, token_counts

log = logging.getLogger(__name__)


def train(cfg: DictConfig, run_dir: str | Path, registry: Registry | None = None) -> Path:
    """Train as `cfg` says; the run directory receives config.yaml, metrics.jsonl and the final model. Other
    processes are kept out of it until the run ends, however it ends. A signal (SIGINT, SIGTERM) stops it after
    saving the step under way, raising `Stopped`."""
    run_dir = Path(run_dir)
    try:
        session, state = setup(cfg, run_dir, registry or Registry())
        with session.resources as resources:
            resources.hooks.on_train_start(run=session.run)
            if resources.evaluator is not None and session.cfg.eval.on_start and state.step == 0:
                session.optimization.model.eval()
                resources.hooks.on_log(run=session.run, step=0, metrics={"step": 0, **resources.evaluator(0)})
            session.started = (time.perf_counter(), state.num_tokens)
            finished = not resources.stop.reason and train_steps(session, state)  # a signal before the first step
            if finished and session.cfg.trainer.save_model:
                save_model(session)
            resources.hooks.on_train_end(run=session.run)
    finally:
        release_run_directory(run_dir)
    if not finished:
        raise Stopped.saved(resources.stop.reason, state.step, run_dir)
    if session.accelerator.is_main_process:
        log.info("Done: %s, %s", run_dir.resolve(), outcome(run_dir))
    return run_dir


def train_steps(session: Session, state: TrainState) -> bool:
    """The optimizer steps from the state's own to the last; False when a signal stopped them, after saving."""
    for step in range(state.step + 1, session.run.max_steps + 1):
        started = time.perf_counter()
        finite, grad_norm = train_step(session, state, step)
        stopping = end_of_step(session, state, step, finite, grad_norm, started)
        if stopping and step < session.run.max_steps:  # at the last step the run is finished however late it came
            return False
    return True


def train_step(session: Session, state: TrainState, step: int) -> tuple[bool, float]:
    """One optimizer step. Returns whether every loss of the step was finite, and the gradient norm."""
    batches, optimization, plan = session.batches, session.optimization, session.plan
    accumulation = plan.accumulation
    # Training mode from generation to the optimizer step, as in TRL: under dropout, the samples, the old log-probs
    # and a LoRA policy's adapter-free reference log-probs all come from training-mode passes, as the trained
    # log-probs do. Only evaluation runs in eval mode.
    optimization.model.train()
    step_start = state.progress()  # where a generation backend that fails mid-step sends the run back
    finite, grad_norm = True, math.nan  # a non-finite loss anywhere in the step skips the whole optimizer step
    try:
        for index in range(accumulation):
            if plan.generation_due(state.micro_step):  # generate -> score -> advantages -> old, reference log-probs
                state.batch = batches.make(session.run, state.micro_step, state.step)
                state.num_tokens += state.batch.tokens
                session.resources.record_samples(step, state.batch)
            micro_batch = state.batch.next(state.micro_step)
            state.micro_step += 1
            ends_step = index == accumulation - 1
            if ends_step and state.lagged is not None:  # forced staleness: these weights, before they move
                state.lagged.remember(state.step)
            # forward -> loss -> backward; after the step's last micro-batch, the optimizer step
            out, finite, step_grad_norm = optimization.train_on(
                micro_batch, state.batch.reduction, finite, ends_step=ends_step, step=step, batch=state.batch
            )
            state.batch.trained(out)
            grad_norm = grad_norm if step_grad_norm is None else step_grad_norm
            add_micro_batch(state.window, state.batch.metrics, out, session.accelerator)
            record_staleness(
                state.window, session.cfg.algorithm, micro_batch, state.batch.weight_version, state.step, out
            )
    except GenerationUnavailable as error:  # the step is undone and the last whole one saved
        state.rewind(step_start)
        optimization.optimizer.zero_grad(set_to_none=True)
        raise saved_and_stopped(error, session, state) from error
    state.step = step
    session.resources.scorer.at_step(step)
    algo = session.cfg.algorithm
    if algo.sync_ref_model and step % algo.ref_model_sync_steps == 0:  # TR-DPO (arXiv 2404.09656)
        mix_into_sharded_reference(
            session.accelerator, optimization.model, batches.reference, algo.ref_model_mixup_alpha
        )
    try:  # the backend's weights: the new ones, or under forced staleness the ones of k steps before
        push_weights(state.lagged, session.resources.generation, optimization.model, step)
    except GenerationUnavailable as error:  # the step itself is whole: save it and stop
        raise saved_and_stopped(error, session, state) from error
    return finite, grad_norm


def end_of_step(session: Session, state: TrainState, step: int, finite: bool, grad_norm: float, started: float) -> bool:
    """The step's side outputs: hooks, eval, the logged line, a checkpoint. Returns whether a signal stops the run
    here (the checkpoint is then written whatever trainer.save_steps says)."""
    t, window, resources, stop = session.cfg.trainer, state.window, session.resources, session.resources.stop
    stop.count_step(step, finite, t.max_bad_steps)
    if finite:
        window["grad_norm"].append(grad_norm)
    window["seconds_per_step"].append(time.perf_counter() - started)
    latest = {name: values[-1] for name, values in window.items()}
    resources.hooks.on_step_end(run=session.run, step=step, metrics=latest)
    evaluated = {}
    if resources.evaluator is not None and resources.evaluator.due(step):
        session.optimization.model.eval()
        try:
            with current_weights(state.lagged, resources.generation, session.optimization.model, step):
                evaluated = resources.evaluator(step)
        except GenerationUnavailable as error:
            raise saved_and_stopped(error, session, state) from error
    last, logged = step == session.run.max_steps, {}
    if step % t.logging_steps == 0 or last or evaluated or (t.logging_first_step and step == 1):
        logged = summarise(window, step, t.gradient_accumulation_steps, session.optimization.learning_rate)
        logged |= token_counts(state.num_tokens, session.started) | evaluated
        window.clear()
        resources.hooks.on_log(run=session.run, step=step, metrics=logged)
    if t.torch_empty_cache_steps and step % t.torch_empty_cache_steps == 0:
        clear_device_cache()  # the caching allocator's free blocks back to the device (nothing on a CPU)
    stopping = stop.reason is not None  # read once: a signal that comes later stops the run after the next step
    planned = (t.save_steps and step % t.save_steps == 0) or last
    if planned or stopping:  # a stopping run saves it all; a planned save competes for the best checkpoint
        save_step(session, state, weights_only=t.save_only_model and not stopping, metrics=logged if planned else None)
    stop.raise_if_non_finite(step)  # after saving the checkpoint to resume from
    return stopping
