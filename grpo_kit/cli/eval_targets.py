"""What `grpo-kit eval PATH` evaluates: a run's final model, one of its checkpoints, or a model folder; and the
config it is evaluated under (the run's own, changed by the command's overrides)."""

from dataclasses import dataclass, replace
from pathlib import Path

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from grpo_kit.config.compose import complete, compose
from grpo_kit.config.overrides import check_choices
from grpo_kit.config.schema import RunConfig
from grpo_kit.contract.errors import ConfigError, InputFileError
from grpo_kit.contract.kinds import KINDS
from grpo_kit.outputs.checkpoints import (
    CHECKPOINTS,
    MANIFEST,
    MODEL,
    PREFIX,
    STATE,
    damage,
    saved_checkpoints,
    trained_steps,
)
from grpo_kit.plugins.registry import Registry

RUN_CONFIG = "config.yaml"  # the resolved config a run writes into its directory (grpo_kit/training/setup.py)


@dataclass
class Target:
    """A model to evaluate: weights in a from_pretrained folder, or in a whole checkpoint's state.pt."""

    path: Path  # as given
    run_dir: Path | None  # the run it comes from; None for a model folder of no run
    model_dir: Path | None  # a from_pretrained folder
    state: Path | None  # a whole checkpoint, whose state.pt holds the weights
    step: int  # the optimizer steps it was trained for (0 for a model of no run): evaluation's seed is seed + step
    output: Path  # where eval.json goes by default


def find_target(path: Path) -> Target:
    """Refuses a path that is none of the three, a run with no final model yet, and a damaged checkpoint."""
    path = Path(path)
    if not path.is_dir():
        raise InputFileError(f"{path} is not a folder: give a run directory, a checkpoint or a model folder.")
    if (path / RUN_CONFIG).is_file():
        return _final_model(path)
    if path.name.startswith(PREFIX) and path.parent.name == CHECKPOINTS:
        return _checkpoint(path)
    if (path / "config.json").is_file():
        run_dir = path.parent if path.name == MODEL and (path.parent / RUN_CONFIG).is_file() else None
        if run_dir is not None:
            return replace(_final_model(run_dir), path=path)
        return Target(path, None, path, None, 0, path)
    raise InputFileError(
        f"{path} is neither a run directory (it would hold {RUN_CONFIG}), a checkpoint (RUN_DIR/{CHECKPOINTS}/"
        f"{PREFIX}NNNNNN) nor a model folder (it would hold config.json, for from_pretrained)."
    )


def run_config(path: Path) -> DictConfig:
    """A grpo_kit run's config.yaml, or an error saying that the folder is another tool's."""
    try:
        return OmegaConf.merge(OmegaConf.structured(RunConfig), OmegaConf.load(path))
    except (OmegaConfBaseException, yaml.YAMLError) as error:
        raise InputFileError(
            f"{path} is not the config of a grpo_kit run ({type(error).__name__}: {str(error).splitlines()[0]}): "
            "give a run directory that python -m grpo_kit wrote, one of its checkpoints, or a model folder."
        ) from None


def _final_model(run_dir: Path) -> Target:
    if not (run_dir / MODEL).is_dir():
        checkpoints = saved_checkpoints(run_dir)
        hint = (
            f"evaluate one of its checkpoints instead: grpo-kit eval {checkpoints[-1]}"
            if checkpoints
            else "it has no checkpoint either"
        )
        raise InputFileError(
            f"{run_dir} has no model yet: RUN_DIR/{MODEL} is written when the run finishes (with "
            f"trainer.save_model=true). Wait for it to finish, or {hint}."
        )
    return Target(run_dir, run_dir, run_dir / MODEL, None, trained_steps(run_dir), run_dir)


def _checkpoint(checkpoint: Path) -> Target:
    reason = damage(checkpoint) if (checkpoint / MANIFEST).exists() else "it has no manifest.json"
    if reason is not None:
        raise InputFileError(f"{checkpoint} cannot be evaluated: {reason}. Evaluate another checkpoint of the run.")
    run_dir = checkpoint.parents[1]
    if not (run_dir / RUN_CONFIG).is_file():
        raise InputFileError(f"{checkpoint} is a checkpoint, but its run directory {run_dir} has no {RUN_CONFIG}.")
    step = int(checkpoint.name.removeprefix(PREFIX))
    if (checkpoint / STATE).is_file():
        return Target(checkpoint, run_dir, None, checkpoint / STATE, step, checkpoint)
    return Target(checkpoint, run_dir, checkpoint / MODEL, None, step, checkpoint)


def eval_config(target: Target, overrides: list[str], registry: Registry) -> DictConfig:
    """The run's config with `overrides` applied (`eval.path=FILE`, `eval.num_samples=8`); for a model folder of no
    run, the config `python -m grpo_kit OVERRIDES` would train with (it must then choose a reward)."""
    if target.run_dir is None:
        return compose([*overrides, f"model.name_or_path={target.model_dir}"], registry)
    parsed = OverridesParser.create().parse_overrides(overrides)
    recomposed = [o for o in parsed if o.key_or_group in KINDS or "/" in o.key_or_group or o.is_delete()]
    if recomposed and target.path == target.model_dir:  # RUN_DIR/model named itself: its own plugins are not asked for
        return compose([*overrides, f"model.name_or_path={target.model_dir}"], registry)
    check_choices(overrides, registry)  # unknown keys and misspelt options, with the closest ones
    cfg = run_config(target.run_dir / RUN_CONFIG)
    if recomposed:
        model_folder = target.model_dir or target.run_dir / MODEL
        raise ConfigError(
            f"{recomposed[0].input_line}: a run is evaluated with its own plugins and presets, so only its settings "
            "can change here (eval.path=FILE, generation.max_completion_length=64). To evaluate with others, name "
            f"the model folder itself, whose config is then composed anew: grpo-kit eval {model_folder} "
            f"{' '.join(overrides)}"
        )
    for override in parsed:
        key = override.key_or_group
        try:
            with open_dict(cfg):  # free keys (eval.sets.NAME, a plugin's options) may be new
                OmegaConf.update(cfg, key, override.value(), merge=True)
        except OmegaConfBaseException as error:
            raise ConfigError(f"{override.input_line}: {error}") from None
    if target.model_dir is not None:  # a saved folder holds the whole model (or its adapters, which it names)
        cfg.model.name_or_path = str(target.model_dir)
        cfg.model.lora.enabled = False
    return complete(cfg, registry)
