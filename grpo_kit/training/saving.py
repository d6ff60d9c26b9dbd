"""What a run writes to resume from or to use: a step's checkpoint, and the trained model."""

import functools
import logging

from grpo_kit.contract.errors import GenerationUnavailable
from grpo_kit.model.sharding import ACCELERATE_STATE, state_is_sharded
from grpo_kit.outputs.checkpoints import (
    CHECKPOINTS,
    load_checkpoint,
    restore_run_files,
    resume_command,
    save_checkpoint,
    write_state,
    write_weights,
)

log = logging.getLogger(__name__)


def save_step(session, state, weights_only: bool = False) -> None:
    """A checkpoint of `state.step`, written by every process together: the whole TrainState, or the model's
    weights only."""
    accelerator, run_dir = session.accelerator, session.run_dir
    if weights_only:
        model = session.optimization.model
        weights = accelerator.get_state_dict(model)  # every process: FSDP and ZeRO-3 gather the whole weights
        write = functools.partial(
            write_weights, model=accelerator.unwrap_model(model), weights=weights, tokenizer=saved_processor(session)
        )
    else:
        checkpoint_state = state.state_dict(accelerator)  # on every process: it gathers their own parts
        parts = None
        if state_is_sharded(accelerator):  # every process writes its own part of the weights and optimizer state
            parts = run_dir / CHECKPOINTS / f".parts-{state.step:06d}"
            accelerator.save_state(parts)
            accelerator.wait_for_everyone()
        write = functools.partial(write_state, state=checkpoint_state, parts=parts)
    if accelerator.is_main_process:
        save_checkpoint(run_dir, state.step, write, keep=session.cfg.trainer.save_total_limit)
    accelerator.wait_for_everyone()


def resume(session, state, checkpoint) -> None:
    """Go on from `checkpoint`: the TrainState, the run's files, and the generation backend's weights."""
    saved = load_checkpoint(checkpoint)
    if state_is_sharded(session.accelerator):  # every process reads its own part of the weights and optimizer state
        session.accelerator.load_state(checkpoint / ACCELERATE_STATE)
    restore_run_files(checkpoint, session.run_dir)
    state.load_state_dict(saved, session.accelerator)  # the last setup step: it restores the random generators too
    session.resources.generation.update_weights(session.optimization.model, state.step)
    session.run.start_step = state.step
    session.resources.scorer.at_step(state.step)
    log.info("Resuming from %s (step %d)", checkpoint, state.step)


def save_model(session) -> None:
    """The trained model and its tokenizer (or processor) in RUN_DIR/model."""
    model, accelerator, directory = session.optimization.model, session.accelerator, session.run_dir / "model"
    weights = accelerator.get_state_dict(model)  # every process: FSDP and ZeRO-3 gather the whole weights
    if accelerator.is_main_process:
        accelerator.unwrap_model(model).save_pretrained(directory, state_dict=weights)
        saved_processor(session).save_pretrained(directory)
        log.info(
            "Model saved to %s (load it with from_pretrained, or train on from it with model.name_or_path=%s)",
            directory.resolve(),
            directory.resolve(),
        )
        session.resources.hooks.on_save(run=session.run, directory=directory)


def saved_and_stopped(error: GenerationUnavailable, session, state) -> GenerationUnavailable:
    """Save the last whole step; the error to stop with, saying how to resume."""
    save_step(session, state)
    return GenerationUnavailable(
        f"{error}\nA checkpoint of step {state.step} is saved; once generation works again, resume with:\n"
        f"  {resume_command(session.run_dir)}"
    )


def saved_processor(session):
    """What turns the model's inputs into tokens, saved beside its weights: a vision-language model's processor (which
    holds its tokenizer), else its tokenizer."""
    return session.run.processor or session.run.tokenizer
