"""The optimizer and the learning-rate schedule, named and built as transformers' Trainer (and so TRL) builds them.

`trainer.optim` and `trainer.optim_args` go through transformers' own mapping from a name to an optimizer class and
its keyword arguments (`Trainer.get_optimizer_cls_and_kwargs`), weight decay spares biases and norm weights as in
`Trainer.create_optimizer`, and `trainer.warmup_steps` and `trainer.lr_scheduler_kwargs` mean what they mean in
`TrainingArguments`. `check_optimization` builds both on a stand-in parameter, so that a wrong name or option fails
before the model is loaded.
"""

import math

import torch
from accelerate import PartialState
from omegaconf import DictConfig, OmegaConf
from transformers import Trainer, TrainingArguments, get_scheduler
from transformers.training_args import OptimizerNames

from grpo_kit.contract.errors import ConfigError

# transformers' optimizers that need more of the training loop than an optimizer step, by a part of their names.
UNSUPPORTED = {
    "lomo": "updates the weights inside the backward pass",
    "layerwise": "steps each layer inside the backward pass",
    "schedule_free": "must be switched between train and eval mode along with the model",
    "galore": "needs transformers' optim_target_modules",
    "apollo": "needs transformers' optim_target_modules",
}
# Schedules that take neither warmup nor options: transformers would drop them without a word.
NO_WARMUP = {"constant"}
NO_OPTIONS = {"constant", "constant_with_warmup"}


def check_optimization(t: DictConfig, device: torch.device, max_steps: int) -> None:
    """The optimizer and schedule of `t`, built on one stand-in parameter: a ConfigError saying what to change
    for an unknown name, a missing package or an option the optimizer or schedule would not use."""
    stand_in = torch.nn.Linear(1, 1, device=device)
    build_scheduler(t, build_optimizer(t, stand_in), max_steps)


def build_optimizer(t: DictConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
    """The optimizer `trainer.optim` names, over the trainable parameters of `model`, with transformers' keyword
    arguments and its weight decay groups."""
    optimizer_class, kwargs = optimizer_recipe(t)
    decayed = set(Trainer.get_decay_parameter_names(None, model))  # the method reads nothing of its Trainer
    trainable = [(name, parameter) for name, parameter in model.named_parameters() if parameter.requires_grad]
    groups = [
        {"params": [p for name, p in trainable if name in decayed], "weight_decay": t.weight_decay},
        {"params": [p for name, p in trainable if name not in decayed], "weight_decay": 0.0},
    ]
    return optimizer_class(groups, **kwargs)


def optimizer_recipe(t: DictConfig) -> tuple[type, dict]:
    """transformers' optimizer class and keyword arguments for `t.optim` and `t.optim_args`.

    TRL's default, adamw_torch_fused, runs on the CPU too: torch has had a fused AdamW for it since 2.4.
    """
    names = [name.value for name in OptimizerNames]
    if t.optim not in names:
        raise ConfigError(
            f"trainer.optim={t.optim} is not an optimizer transformers knows; choose one of {', '.join(names)}."
        )
    for part, need in UNSUPPORTED.items():
        if part in t.optim:
            raise ConfigError(
                f"trainer.optim={t.optim} {need}, which grpo_kit's training loop does not do: choose another optimizer."
            )
    given = _parse(t.optim_args)
    optimizer_class, kwargs = _recipe(t, given)
    # transformers passes optim_args only to some optimizers, and only the keys each one reads: refuse the rest.
    unused = [key for key in given if _recipe(t, {k: v for k, v in given.items() if k != key})[1] == kwargs]
    if "weight_decay" in given:  # the parameter groups set it
        unused.append("weight_decay (set trainer.weight_decay)")
    if unused:
        raise ConfigError(
            f"trainer.optim_args: {', '.join(unused)} would have no effect on {t.optim} ({optimizer_class.__name__}); "
            "leave it out."
        )
    return optimizer_class, kwargs


def build_scheduler(t: DictConfig, optimizer: torch.optim.Optimizer, max_steps: int):
    """transformers' `get_scheduler` for `t.lr_scheduler_type`, its warmup and its `lr_scheduler_kwargs`."""
    warmup = warmup_steps(t, max_steps)
    options = OmegaConf.to_container(t.lr_scheduler_kwargs) if t.lr_scheduler_kwargs else {}
    if warmup and t.lr_scheduler_type in NO_WARMUP:
        raise ConfigError(
            f"trainer.lr_scheduler_type={t.lr_scheduler_type} has no warmup: use constant_with_warmup, or set "
            "trainer.warmup_steps and trainer.warmup_ratio to 0."
        )
    if options and t.lr_scheduler_type in NO_OPTIONS:
        raise ConfigError(f"trainer.lr_scheduler_type={t.lr_scheduler_type} takes no trainer.lr_scheduler_kwargs.")
    try:
        return get_scheduler(
            t.lr_scheduler_type,
            optimizer,
            num_warmup_steps=warmup,
            num_training_steps=max_steps,
            scheduler_specific_kwargs=options,
        )
    except (TypeError, ValueError) as error:
        raise ConfigError(
            f"trainer.lr_scheduler_type={t.lr_scheduler_type}, lr_scheduler_kwargs={options}: {error}"
        ) from error


def warmup_steps(t: DictConfig, max_steps: int) -> int:
    """transformers' warmup_steps where it is > 0 (a number of steps, or below 1 a share of `max_steps`), else
    warmup_ratio's share."""
    if t.warmup_steps < 0 or t.warmup_ratio < 0:
        raise ConfigError("trainer.warmup_steps and trainer.warmup_ratio must be >= 0.")
    if t.warmup_steps > 0:
        return int(t.warmup_steps) if t.warmup_steps >= 1 else math.ceil(t.warmup_steps * max_steps)
    return math.ceil(t.warmup_ratio * max_steps)


def _recipe(t: DictConfig, optim_args: dict[str, str]) -> tuple[type, dict]:
    # TrainingArguments would set accelerate's process state up afresh; told to use the configured one, it keeps
    # the run's Accelerator's. Called without one (directly), a stand-in is set up and then removed.
    temporary = not PartialState._shared_state
    if temporary:
        PartialState(cpu=True)
    try:
        args = TrainingArguments(
            optim=t.optim,
            optim_args=",".join(f"{key}={value}" for key, value in optim_args.items()) or None,
            learning_rate=t.learning_rate,
            adam_beta1=t.adam_beta1,
            adam_beta2=t.adam_beta2,
            adam_epsilon=t.adam_epsilon,
            weight_decay=t.weight_decay,
            use_cpu=True,  # which device transformers would pick is not asked, and picking one has side effects
            accelerator_config={"use_configured_state": True},
            report_to="none",
        )
        return Trainer.get_optimizer_cls_and_kwargs(args)
    except (ImportError, ValueError) as error:  # a missing package, a bad option value
        raise ConfigError(f"trainer.optim={t.optim}: {error}") from error
    finally:
        if temporary:
            PartialState._reset_state()


def _parse(optim_args: str | None) -> dict[str, str]:
    pairs = [item.split("=") for item in (optim_args or "").replace(" ", "").split(",") if item]
    if any(len(pair) != 2 for pair in pairs):
        raise ConfigError(
            f"trainer.optim_args={optim_args!r} is not KEY=VALUE pairs separated by commas, such as "
            "'momentum=0.9,nesterov=true'."
        )
    return dict(pairs)
