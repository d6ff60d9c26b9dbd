"""The run's configuration: the core's sections as dataclasses, and every plugin's config in Hydra's ConfigStore.

A plugin's config dataclass is stored under its kind with its name (``loss/dapo``), so ``+loss=dapo`` selects it
and ``loss.epsilon=0.3`` sets one of its fields; a misspelled field is rejected before Hydra composes, with the
closest ones (`check_option_keys`). Rewards and hooks are stored at ``reward.NAME`` so that several can be selected
at once (``+reward=[a,b]``); each node carries its plugin's name, so one plugin may be placed under other keys too
(``+reward@reward.brevity=python``).
"""

import dataclasses
import difflib
import importlib.resources
import logging
import os
import re
import typing
from dataclasses import dataclass, field
from typing import Any

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType
from omegaconf import DictConfig, OmegaConf, open_dict

from grpo_kit.config.compatibility import check_compatibility
from grpo_kit.contract.errors import ConfigError, PluginError
from grpo_kit.contract.kinds import KINDS, MULTI_CHOICE_KINDS, OPTIONAL_KINDS
from grpo_kit.plugins.registry import Registry

log = logging.getLogger(__name__)

PRESETS_MODULE = "grpo_kit.conf"  # conf/ in a checkout, shipped inside the wheel
PRIMARY_CONFIG = "grpo_kit"

# The choices a run makes when the command line makes none (TRL's defaults, and DAPO's loss). They are names in
# the config, not imports: a default whose plugin is not installed is left unselected.
DEFAULT_CHOICES = {
    "loss": "dapo",
    "importance_sampling": "token",
    "rollout_correction": "none",
    "advantage": "group",
    "generation": "transformers",
}
SINGLE_CHOICE_KINDS = [kind for kind in KINDS if kind not in MULTI_CHOICE_KINDS]


@dataclass
class LoraConfig:
    """PEFT LoRA (Hu et al. 2021, https://arxiv.org/abs/2106.09685): train low-rank updates of the weights only.

    With LoRA the reference model of the KL term is the frozen base model itself (the adapters turned off), so no
    copy of the model is kept.
    """

    enabled: bool = False
    r: int = 16
    alpha: int = 32
    dropout: float = 0.05
    target_modules: Any = "all-linear"  # module names, or PEFT's "all-linear": every linear layer but the head


@dataclass
class ModelConfig:
    name_or_path: str | None = None  # a hub id or a local folder; None builds the embedded tiny model
    # A dict for from_pretrained: model.model_init_kwargs={dtype:bfloat16}. `Any`, not `dict`: Hydra
    # rejects new keys in a typed dict, and these keys are free.
    model_init_kwargs: Any = None
    # Run the model's and its tokenizer's own code from the hub (and the reward model's, unless its reward says
    # otherwise): only for a repository you trust.
    trust_remote_code: bool = False
    disable_dropout: bool = False  # every dropout off: the same input then always gets the same log-probs
    cast_lm_head_to_fp32: bool = False  # ScaleRL (arXiv 2510.13786): logits in float32; untied heads only
    # Recompute activations in the backward pass: less memory, more time (trainer.gradient_checkpointing_kwargs
    # tunes it). true, false, or auto: on where the model supports it, which the log says.
    gradient_checkpointing: Any = False
    # Large vocabularies (docs/training.md): full materialises the (B, T, V) logits; chunked never does (log-probs
    # from the last hidden states, logits_chunk_size positions at a time); tiled holds no more than a tile of
    # logits_chunk_size positions x logits_vocab_tile columns; liger uses liger-kernel's fused linear GRPO loss where
    # it equals the plain loss (TRL's use_liger_kernel; pip install 'grpo-kit[liger]'), else chunked.
    logits: str = "full"
    logits_chunk_size: int = 1024  # positions whose logits exist at once (chunked, tiled, and liger's metrics)
    logits_vocab_tile: int = 32768  # vocabulary columns of a tile (tiled)
    # Speed-ups of the forward passes (docs/training.md, "Speed-ups"), each where it applies and giving the plain
    # pass's values up to float rounding; false takes the plain pass, to compare or to rule one out.
    mask_free_passes: bool = True  # no attention mask where each row's tokens are one span: rows moved left
    # A micro-batch of mixed completion lengths as two passes, each cut to its longest: true, false, or auto (on, but
    # on a CUDA GPU, where each pass's shape costs kernel plans). `Any`: a boolean or "auto".
    length_groups: Any = "auto"
    cpu_chunked_attention: bool = True  # a CPU model's SDPA causal attention in chunks of 64 queries
    # Each training pass's width (prompt + completion columns) rounded up to a multiple of this many tokens, so that a
    # GPU sees few shapes (TRL's pad_to_multiple_of): a number, null, or auto (64 on a CUDA GPU, none elsewhere).
    pad_to_multiple_of: Any = "auto"
    lora: LoraConfig = field(default_factory=LoraConfig)
    # A vision-language model's image encoder (docs/vision.md): true trains it (LoRA: adapters on it too), false
    # keeps it as loaded; auto trains it in full fine-tuning (as TRL does) and keeps it under LoRA.
    train_vision_tower: Any = "auto"
    embedded: str = "sums"  # which embedded model name_or_path=null builds: sums, tool_use (calls a calculator), vision


@dataclass
class DataConfig:
    path: str | None = None  # json/jsonl/parquet/csv file, or a hub dataset; None generates the embedded task
    name: str | None = None  # the hub dataset's configuration
    split: str = "train"
    shuffle: bool = True  # false: the dataset's own order, epoch after epoch (TRL's shuffle_dataset)
    # Extra variables for the tokenizer's chat template, wherever a chat prompt is rendered (training, evaluation,
    # tool turns): data.chat_template_kwargs={enable_thinking:false} for Qwen3. `Any`: its keys are free.
    chat_template_kwargs: Any = None
    num_examples: int = 2000  # size of the embedded task
    # Which embedded task path=null generates: sums, tool_use (2-digit sums as chat) or vision (counting squares).
    embedded: str = "sums"


@dataclass
class AlgorithmConfig:
    """The objective's settings that belong to no single plugin (TRL's defaults)."""

    beta: float = 0.0  # weight of the k3 KL to a reference model, which is loaded only when beta > 0
    use_bias_correction_kl: bool = True  # KL times the importance weight (DeepSeek-V3.2, arXiv 2512.02556)
    top_entropy_quantile: float = 1.0  # train only the top share of tokens by entropy (arXiv 2506.01939: 0.2)
    entropy_coef: float = 0.0  # entropy bonus: the loss minus entropy_coef x the mean entropy
    # Skywork-OR1's adaptive entropy control (arXiv 2505.22312): entropy_coef moves by entropy_coef_delta each
    # optimizer step, up while the step's mean entropy is at or below entropy_target, down otherwise, within
    # [entropy_coef_min, entropy_coef_max]; the bonus applies only while the last step's entropy is <= the target.
    use_adaptive_entropy: bool = False
    entropy_coef_min: float = 0.0
    entropy_coef_max: float = 1.0
    entropy_coef_delta: float = 0.005
    entropy_target: float = 0.2  # nats, over the tokens the loss trains on
    # MoE models: weight of the router's load-balancing loss added to the loss; None: the model config's own
    # router_aux_loss_coef (0 disables it). Refused for a model that is not a mixture of experts.
    router_aux_loss_coef: float | None = None
    off_policy_mask_threshold: float | None = None  # DeepSeek-V3.2's delta: drop stale negative sequences
    num_iterations: int = 1  # optimisation passes over each generation batch (mu in the GRPO paper)
    steps_per_generation: int | None = None  # micro-batches per generation batch; None: gradient_accumulation_steps
    # Asynchronous generation (docs/async.md): a worker generates the next batches while this one trains, never
    # more than this many optimizer steps behind the weights that train on them. 0: synchronous, as TRL.
    max_staleness: int = 0
    mask_truncated_completions: bool = False  # DAPO: a cut-off answer neither rewarded nor punished
    sync_ref_model: bool = False  # TR-DPO (arXiv 2404.09656): move the reference model toward the policy
    ref_model_mixup_alpha: float = 0.6  # ref <- alpha * policy + (1 - alpha) * ref
    ref_model_sync_steps: int = 512  # every this many optimizer steps
    # false: a rollout correction applies only where the generation backend is not the trained model itself (vLLM),
    # as TRL's vllm_importance_sampling_correction does; model=hf sets it.
    correct_policy_sampler: bool = True
    # Multi-turn tool use (+environment=NAME or tools=[...], docs/agents.md)
    max_tool_calling_iterations: int | None = None  # rounds of tool calls per completion; None: until the length ends
    tool_timeout: float = 30.0  # seconds a tool call may take; a slower one counts as a failure


@dataclass
class TrainerConfig:
    max_steps: int = 500  # optimizer steps; -1: as many as num_train_epochs passes over the prompts take (TRL)
    num_train_epochs: float = 3.0  # used only with max_steps=-1
    learning_rate: float = 1e-6
    per_device_train_batch_size: int = 8  # completions per micro-batch
    gradient_accumulation_steps: int = 1
    lr_scheduler_type: str = "linear"
    lr_scheduler_kwargs: Any = None  # the schedule's own options: {num_cycles:2} for cosine. `Any`: free keys
    warmup_ratio: float = 0.0
    warmup_steps: float = 0  # > 0 replaces warmup_ratio: a number of steps, or below 1 a share of them (transformers)
    # transformers' optimizer names (docs/training.md): adamw_torch, adamw_torch_fused, adafactor, sgd, adamw_8bit...
    optim: str = "adamw_torch_fused"
    optim_args: str | None = None  # the optimizer's own options, as in transformers: "momentum=0.9,nesterov=true"
    weight_decay: float = 0.0  # not on biases and norm weights, as in transformers
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8
    max_grad_norm: float = 1.0
    # Micro-batches of completions of similar lengths, each padded only to its own longest: less compute for the
    # same gradient (grpo_kit/training/batches.py). None: wherever the loss and settings leave the gradient unchanged.
    group_by_length: bool | None = None
    # Micro-batches cut by a token budget instead of per_device_train_batch_size completions: each at most this many
    # padded tokens (or, with packing, tokens), shortest completions first; the same gradient. None: fixed row counts.
    max_tokens_per_micro_batch: int | None = None
    # Padding-free passes: several sequences per row, each attending only to itself (grpo_kit/model/packing.py).
    packing: bool = False
    # no, bf16 (CPU too) or fp16 (GPU): accelerate's autocast around the forward passes; auto: bf16 on a GPU that
    # has it, else no (the log says which).
    mixed_precision: str = "no"
    # torch.utils.checkpoint's options when model.gradient_checkpointing is on (use_reentrant: false unless given),
    # and transformers' every_n_layers and offload. `Any`: its keys are free.
    gradient_checkpointing_kwargs: Any = None
    report_to: list[str] = field(default_factory=list)  # experiment trackers: tensorboard, wandb (offline), trackio
    project: str = "grpo_kit"  # the trackers' project (TRL's default is huggingface)
    run_name: str | None = None  # the trackers' name for this run; None: the run directory's last two parts
    logging_steps: int = 1
    progress_bar: bool = True
    save_model: bool = True  # save_pretrained into the run directory at the end
    save_steps: int = 0  # a checkpoint every this many steps (0: only at the end) in RUN_DIR/checkpoints
    save_total_limit: int = 2  # checkpoints kept, newest first
    # Checkpoints of the model's weights only (RUN_DIR/checkpoints/step-N/model/), which cannot be resumed; one
    # written because the run stops early stays whole.
    save_only_model: bool = False
    resume: str | None = None  # auto (the run directory's newest checkpoint, if any) or a checkpoint/run path
    resume_force: bool = False  # resume even though the settings changed since the checkpoint
    max_bad_steps: int = 5  # non-finite losses in a row before the run saves and stops
    reward_timeout: float = 60.0  # seconds a batch's rewards may take; a reward still running gives None
    # Processes for CPU-heavy rewards (math verifiers), started when a batch first needs them; None: one per CPU
    # this process may use, up to 8.
    reward_workers: int | None = None
    # Threads torch computes with on the CPU; None: OMP_NUM_THREADS if set, else the cores this process may use
    # divided by the runs a parallel sweep trains at once (docs/training.md, "Threads and busy machines").
    torch_threads: int | None = None
    sample_every: int = 50  # steps between sample tables (samples.jsonl, samples.html); 0: none
    sample_rows: int = 16  # completions per sample table


@dataclass
class EvalConfig:
    """Held-out prompts, generated for and scored like training prompts, with their metrics logged under eval/.

    Evaluation is on when an eval set is named: a file or hub dataset (`path`), or a split of the training hub
    dataset (`split`). The embedded task's `test` split holds sums that neither its pretraining nor its training
    sees; its `train` split, sums it is trained on.
    """

    path: str | None = None  # a json/jsonl/parquet/csv file or a hub dataset of eval prompts
    split: str | None = None  # the split of `path`, or of data.path when `path` is not given
    steps: int = 0  # evaluate every this many steps, and always at the end (0: only at the end)
    on_start: bool = False  # also evaluate the policy before its first step, logged as step 0 (TRL's eval_on_start)
    num_examples: int = 128  # prompts evaluated: the first ones of the eval set
    num_generations: int | None = None  # completions per eval prompt (TRL's num_generations_eval); None: as training
    batch_size: int = 32  # prompts per generate call
    # pass@k and maj@k (docs/evaluation.md): num_samples completions per eval prompt, sampled with temperature and
    # top_p (None: the run's generation settings), each counted correct where its reward is >= correct_threshold.
    num_samples: int | None = None  # None: no pass@k / maj@k
    pass_at: list[int] | None = None  # the k of pass@k and maj@k, each <= num_samples; None: [1, num_samples]
    temperature: float | None = None
    top_p: float | None = None
    correct_threshold: float = 1.0
    # The answer a completion votes for in maj@k: the last match of this regular expression (its first group, if it
    # has one); None: the whole completion, stripped. A completion without one does not vote.
    answer_pattern: str | None = None
    # More eval sets by name, each logged under eval/NAME/: eval.sets.NAME.path=FILE (and .split, .num_examples).
    # `Any`: its keys are the sets' free names.
    sets: Any = field(default_factory=dict)


@dataclass
class EvalSetConfig:
    """One named eval set (`eval.sets.NAME`); every other eval setting is the `eval` section's."""

    path: str  # a json/jsonl/parquet/csv file or a hub dataset
    split: str | None = None  # the hub dataset's split ("train" when not given)
    num_examples: int | None = None  # None: eval.num_examples


@dataclass
class RolloutsConfig:
    save: bool = False  # keep every scored generation batch in RUN_DIR/rollouts/ (for rollouts.replay)
    replay: str | None = None  # a run directory whose saved rollouts this run trains on instead of generating


@dataclass
class RunConfig:
    seed: int = 42
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    rollouts: RolloutsConfig = field(default_factory=RolloutsConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    # One node per plugin kind, filled by the group choices (`+loss=dapo`, `advantage=rloo`, ...).
    loss: Any = None
    importance_sampling: Any = None
    rollout_correction: Any = None
    advantage: Any = None
    generation: Any = None
    environment: Any = None  # +environment=NAME: tools from an environment built per completion
    rollout: Any = None  # +rollout=NAME: a custom generation instead of the generation backend's
    tools: list[str] = field(default_factory=list)  # tool functions by import path: tools=[pkg.mod:fn]
    reward: dict = field(default_factory=dict)  # name -> options, one entry per selected reward
    hook: dict = field(default_factory=dict)  # name -> options, one entry per selected hook plugin


def store_configs(registry: Registry) -> None:
    """Put the primary config and every installed plugin's config into Hydra's ConfigStore."""
    store = ConfigStore.instance()
    for kind in KINDS:
        store.repo.pop(kind, None)  # forget plugins of an earlier registry
        for plugin in registry.plugins(kind):
            node = _with_name(plugin.config, plugin.name)
            if kind in MULTI_CHOICE_KINDS:
                store.store(group=kind, name=plugin.name, node=node, package=f"{kind}.{plugin.name}")
            else:
                store.store(group=kind, name=plugin.name, node=node)
    defaults: list[Any] = ["_self_"]
    # Every single-choice kind gets an entry, null when its default is not installed, so that `kind=NAME` (and the
    # `+kind=NAME` that with_presets rewrites into it) selects a plugin the same way in either case.
    defaults += [
        {kind: DEFAULT_CHOICES[kind] if DEFAULT_CHOICES.get(kind) in registry.names(kind) else None}
        for kind in SINGLE_CHOICE_KINDS
    ]
    defaults += [{"model": "embedded"}, {"data": "embedded"}]  # after the plugins: the presets tune their options
    # The log goes to the console here, and to RUN_DIR/cli.log once the run has claimed its directory: a run that
    # is refused (grpo_kit/cli/main.py) writes nothing there, not even .hydra/, which the CLI writes itself.
    defaults += [{"override hydra/job_logging": "stdout"}]
    primary = OmegaConf.structured(RunConfig)
    with open_dict(primary):
        primary.defaults = defaults
        primary.hydra = {
            "searchpath": [f"pkg://{PRESETS_MODULE}"],
            "output_subdir": None,
            # Every sweep ends by writing its report into its directory; '~hydra.callbacks.report' turns it off.
            # `failures` finds the runs that failed, for the sweep to exit non-zero (grpo_kit/cli/main.py).
            "callbacks": {
                "report": {"_target_": "grpo_kit.report.callback.ReportCallback"},
                "failures": {"_target_": "grpo_kit.report.callback.FailedRuns"},
            },
        }
    store.store(name=PRIMARY_CONFIG, node=primary)


def _with_name(config: type, name: str) -> type:
    """The plugin's dataclass plus the `name` field that tells the core which plugin the node belongs to."""
    return dataclasses.make_dataclass(config.__name__, [("name", str, field(default=name))], bases=(config,))


def compose(overrides: list[str] | tuple[str, ...] = (), registry: Registry | None = None) -> DictConfig:
    """The config that `python -m grpo_kit OVERRIDES...` would run with."""
    registry = registry or Registry()
    cfg = complete(hydra_composition(overrides, registry), registry)
    note_default_loss(cfg, overrides)
    return cfg


def hydra_composition(overrides: list[str] | tuple[str, ...], registry: Registry) -> DictConfig:
    """What Hydra composes of `overrides` and `registry`'s plugins, before `complete` checks that it can run (a
    registry of one plugin, as the conformance kit makes, composes too)."""
    check_choices(overrides, registry)
    store_configs(registry)
    with hydra.initialize_config_module(PRESETS_MODULE, version_base="1.3"):
        return hydra.compose(PRIMARY_CONFIG, overrides=with_presets(overrides))


# Naming a real model or dataset selects its preset too, so that the embedded model's tuned settings
# (a high learning rate, tiny completions) never reach a real model by accident.
PRESET_FOR_PATH = {"model.name_or_path": ("model", "hf"), "data.path": ("data", "hf")}


def with_presets(overrides: list[str]) -> list[str]:
    """The overrides to hand Hydra: `overrides` in their order, each `+KIND=NAME` of a single-choice kind written
    `KIND=NAME`, then `model=hf` when a model path is given without a model preset (likewise data).

    Every single-choice kind has an entry in the defaults list (the loss's is dapo), which Hydra changes with
    `loss=NAME` and refuses to add again with `+loss=NAME`; users and the docs write the `+`, so both are taken.
    """
    parsed = OverridesParser.create().parse_overrides(list(overrides))
    groups = {override.key_or_group for override in parsed}
    rewritten, added = [], []
    for text, override in zip(overrides, parsed):
        is_added_choice = override.is_add() and override.key_or_group in SINGLE_CHOICE_KINDS and not override.package
        # An eval set's keys are new ones, which Hydra takes only as ++; users write eval.sets.NAME.path=FILE.
        names_an_eval_set = override.key_or_group.startswith("eval.sets.") and override.type == OverrideType.CHANGE
        rewritten.append(text.removeprefix("+") if is_added_choice else f"++{text}" if names_an_eval_set else text)
        group, preset = PRESET_FOR_PATH.get(override.key_or_group, (None, None))
        if group and group not in groups and override.value() is not None:
            log.info("%s is given: using the %s=%s preset", override.key_or_group, group, preset)
            added.append(f"{group}={preset}")
            groups.add(group)
    if "environment" in groups:  # the embedded model that calls tools, on a task it needs them for
        added += [f"{group}={EMBEDDED_TOOL_USE_PRESET}" for group in ("model", "data") if group not in groups]
    if "model" not in groups and EMBEDDED_VISION_PRESET in _choices(parsed, "data"):  # the model that sees its images
        added.append(f"model={EMBEDDED_VISION_PRESET}")
    return rewritten + added


EMBEDDED_TOOL_USE_PRESET = "embedded_tool_use"  # conf/model/ and conf/data/: chosen by +environment=NAME
EMBEDDED_VISION_PRESET = "embedded_vision"  # conf/model/: chosen by data=embedded_vision


def _choices(overrides: list[Override], group: str) -> list[str]:
    return [name for override in overrides if override.key_or_group == group for name in _chosen_names(override)]


def check_choices(overrides: list[str] | tuple[str, ...], registry: Registry) -> None:
    """Fail on an unknown key, or on a plugin name that is not installed (with the installed choices), before
    anything is composed."""
    parsed = OverridesParser.create().parse_overrides(list(overrides))
    check_top_level_keys(parsed)
    for override in parsed:
        if override.key_or_group in KINDS and not override.is_delete():
            for name in _chosen_names(override):
                registry.get(override.key_or_group, name)
    check_option_keys(parsed, registry)


def check_top_level_keys(overrides: list[Override]) -> None:
    """Fail on an override whose first key is none of the run's sections, plugin kinds, preset groups or `hydra`:
    Hydra would add it as a new key that nothing reads (`+hooks=dynamic_sampling` for `+hook=...`)."""
    valid = top_level_keys()
    for override in overrides:
        keys = [override.key_or_group] + ([override.package] if override.package else [])
        for unknown in [key for key in keys if _first_key(key) not in valid and not key.startswith("_")]:
            close = difflib.get_close_matches(_first_key(unknown), valid, n=1)
            hint = f"Did you mean {close[0]!r}? " if close else ""
            raise ConfigError(
                f"{override.input_line}: {_first_key(unknown)!r} is not a setting of a grpo_kit run, so nothing would "
                f"read it. {hint}The top-level keys are: {', '.join(valid)}. `python -m grpo_kit --cfg job` shows the "
                "whole config, `grpo-kit plugins` every plugin option."
            )


def check_option_keys(overrides: list[Override], registry: Registry) -> None:
    """Fail on a misspelt option of a section or a plugin (`trainer.max_step=10`, `+loss.alpah=0.5`), naming the
    closest ones: Hydra would advise `+` for it, and would take it with `+` as a new key that nothing reads.

    Keys are checked down to the first option that is no dataclass: below it they are free
    (`data.chat_template_kwargs.enable_thinking`), or Hydra checks them itself.
    """
    for override in overrides:
        key = override.key_or_group
        first, *rest = key.split(".")
        if override.is_delete() or override.package or not rest or "/" in key or first not in OPTION_ROOTS:
            continue
        prefix = owner = first  # owner: what the message calls the options' owner ("loss dapo")
        if first in MULTI_CHOICE_KINDS:  # reward.NAME.OPTION
            places = multi_choice_places(first, overrides, registry)
            place, *rest = rest
            if place not in places:
                _refuse(override, place, first, f"no {first} the run can select is named {place!r}", places)
            classes, prefix = places[place], f"{first}.{place}"
            owner = prefix
        elif first in KINDS:
            names = plugins_chosen(first, overrides, registry)
            classes, owner = [_plugin_config(registry, first, name) for name in names], f"{first} {'/'.join(names)}"
        else:
            classes = [OPTION_ROOTS[first]]
        for part in rest:
            types = _field_types(classes)
            if part not in types:
                _refuse(override, part, prefix, f"{part!r} is not an option of {owner}", types)
            classes = [kind for kind in types[part] if dataclasses.is_dataclass(kind)]
            if not classes:
                break
            prefix = owner = f"{prefix}.{part}"


# The first keys whose options are checked: the sections that are dataclasses, and every plugin kind.
OPTION_ROOTS = {
    **{field_.name: field_.type for field_ in dataclasses.fields(RunConfig) if dataclasses.is_dataclass(field_.type)},
    **dict.fromkeys(KINDS),
}


def plugins_chosen(kind: str, overrides: list[Override], registry: Registry) -> list[str]:
    """The plugins of a single-choice kind that `overrides` may select: the one they name, else the default one
    when no preset may choose another (model=hf, +experiment=dapo), else every installed one."""
    named = [
        name
        for override in overrides
        if override.key_or_group == kind and not override.is_delete()
        for name in _chosen_names(override)
    ]
    if named:
        return named
    if DEFAULT_CHOICES.get(kind) in registry.names(kind) and not any(map(_may_choose_plugins, overrides)):
        return [DEFAULT_CHOICES[kind]]
    return registry.names(kind)


def multi_choice_places(kind: str, overrides: list[Override], registry: Registry) -> dict[str, list[type]]:
    """Where a reward or hook may sit (reward.NAME), with its plugin's config: each installed plugin at its own
    name, and each one placed elsewhere (`+reward@reward.brevity=python`)."""
    places = {name: [_plugin_config(registry, kind, name)] for name in registry.names(kind)}
    for override in overrides:
        if override.key_or_group == kind and (override.package or "").startswith(f"{kind}."):
            places[override.package.split(".")[1]] = [
                _plugin_config(registry, kind, name) for name in _chosen_names(override)
            ]
    return places


def _may_choose_plugins(override: Override) -> bool:
    """A preset choice (model=hf, +experiment=dapo, +sweep/losses=grpo), or a model or dataset path, which
    chooses a preset."""
    key = override.key_or_group
    return key in PRESET_FOR_PATH or ("." not in key and _first_key(key) in preset_groups())


def _chosen_names(override: Override) -> list[str]:
    if override.is_sweep_override():
        return [str(name) for name in override.sweep_string_iterator()]
    value = override.value()
    return [str(name) for name in (value if isinstance(value, list) else [value])]


def _plugin_config(registry: Registry, kind: str, name: str) -> type:
    return _with_name(registry.get(kind, name).config, name)


def _field_types(classes: list[type]) -> dict[str, list]:
    """Each field name of `classes` (dataclasses), with the types it has in them."""
    types: dict[str, list] = {}
    for cls in classes:
        hints = typing.get_type_hints(cls)
        for field_ in dataclasses.fields(cls):
            types.setdefault(field_.name, []).append(hints[field_.name])
    return types


def _refuse(override: Override, unknown: str, prefix: str, problem: str, valid) -> None:
    close = difflib.get_close_matches(unknown, list(valid), n=3, cutoff=0.6)
    hint = f"Did you mean {' or '.join(repr(f'{prefix}.{key}') for key in close)}? " if close else ""
    raise ConfigError(
        f"{override.input_line}: {problem}, so nothing would read it. {hint}The options of {prefix}: "
        f"{', '.join(sorted(valid))}. `python -m grpo_kit --cfg job` shows the whole config, `grpo-kit plugins` "
        "every plugin option."
    )


def top_level_keys() -> list[str]:
    """The run config's sections, Hydra's own key, and the preset groups in conf/ (experiment, sweep, ...)."""
    sections = [f.name for f in dataclasses.fields(RunConfig)]
    return sorted({*sections, "hydra", *preset_groups()})


def preset_groups() -> list[str]:
    folders = [entry.name for entry in importlib.resources.files(PRESETS_MODULE).iterdir() if entry.is_dir()]
    return [name for name in folders if not name.startswith("_") and name not in NOT_PRESETS]


NOT_PRESETS = {"accelerate"}  # conf/accelerate/ holds `accelerate launch --config_file` files, not Hydra presets


def preset_choices() -> dict[str, list[str]]:
    """Each preset group in conf/ (`sweep/losses` for a folder inside one) with its presets' names, sorted."""
    choices: dict[str, list[str]] = {}

    def visit(folder, group: str) -> None:
        names = sorted(entry.name.removesuffix(".yaml") for entry in folder.iterdir() if entry.name.endswith(".yaml"))
        if names:
            choices[group] = names
        for entry in folder.iterdir():
            if entry.is_dir() and not entry.name.startswith("_"):
                visit(entry, f"{group}/{entry.name}")

    for entry in importlib.resources.files(PRESETS_MODULE).iterdir():
        if entry.is_dir() and not entry.name.startswith("_") and entry.name not in NOT_PRESETS:
            visit(entry, entry.name)
    return dict(sorted(choices.items()))


def _first_key(key: str) -> str:
    return re.split(r"[./]", key, maxsplit=1)[0]


def complete(cfg: DictConfig, registry: Registry) -> DictConfig:
    """Check that every kind has a plugin, and that the chosen plugins and settings go together."""
    for kind in SINGLE_CHOICE_KINDS:
        if kind in OPTIONAL_KINDS and cfg[kind] is None:
            continue
        if cfg[kind] is None or "name" not in cfg[kind]:
            installed = ", ".join(registry.names(kind)) or "none"
            default = DEFAULT_CHOICES[kind]
            why = "" if default in registry.names(kind) else f", and the default {default!r} is not installed"
            raise PluginError(f"No {kind} plugin selected{why}: choose one with +{kind}=NAME (installed: {installed}).")
        registry.get(kind, cfg[kind].name)  # a name stored by an earlier registry fails here, by name
    check_compatibility(cfg, registry)
    return cfg


def check_rewards_chosen(cfg: DictConfig, registry: Registry) -> None:
    """A run needs a reward; a composed config does not (`--cfg job`, a preset that a reward is added to)."""
    if not cfg.reward:
        raise no_reward(registry)


def check_a_reward_may_be_chosen(overrides: list[str] | tuple[str, ...], registry: Registry) -> None:
    """Refuse a run whose overrides name no reward where no preset or Hydra setting may add one, before Hydra
    composes it: a forgotten +reward then answers as fast as a misspelt key."""
    parsed = OverridesParser.create().parse_overrides(list(overrides))
    if not any(_may_add_a_reward(override.key_or_group) for override in parsed):
        raise no_reward(registry)


def _may_add_a_reward(key: str) -> bool:
    """`reward...`, a preset choice (`+experiment=dapo` adds one), or a sweeper's (`hydra.sweeper.params`)."""
    first = _first_key(key)
    return (
        first == "reward"
        or key.startswith(("hydra.sweeper", "hydra/sweeper"))
        or (first in preset_groups() and "." not in key)
    )


def no_reward(registry: Registry) -> PluginError:
    return PluginError(f"No reward selected: add +reward=NAME (installed: {', '.join(registry.names('reward'))}).")


def note_default_loss(cfg: DictConfig, overrides: list[str] | tuple[str, ...]) -> None:
    """Say so when the loss is the default one because the command line named none (`+loss=dapo` names it)."""
    named = any(
        override.key_or_group == "loss" for override in OverridesParser.create().parse_overrides(list(overrides))
    )
    # Every process of a multi-process launch composes the config; one says so.
    if cfg.loss.name == DEFAULT_CHOICES["loss"] and not named and is_main_process():
        log.info("loss: %s, the default (choose another with +loss=NAME)", cfg.loss.name)


def is_main_process() -> bool:
    """Whether this is the main process of a launch, before the accelerator exists to say so: torchrun and
    accelerate launch set RANK in every process they start; a process started alone has none."""
    return os.environ.get("RANK", "0") == "0"


def options(node: DictConfig) -> dict:
    """A plugin node's option values, resolved, without the `name` the core added; `Registry.build` makes the
    plugin's config dataclass of them."""
    values = OmegaConf.to_container(node, resolve=True)
    values.pop("name", None)
    return values
