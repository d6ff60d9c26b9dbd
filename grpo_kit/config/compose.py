"""Composing a run's config with Hydra: every installed plugin's config in Hydra's ConfigStore, the overrides
handed to Hydra, and the composed config completed (a plugin for every kind, settings that go together).

A plugin's config dataclass is stored under its kind with its name (``loss/dapo``), so ``+loss=dapo`` selects it
and ``loss.epsilon=0.3`` sets one of its fields; a misspelled field is rejected before Hydra composes, with the
closest ones (grpo_kit/config/overrides.py). Rewards and hooks are stored at ``reward.NAME`` so that several can be
selected at once (``+reward=[a,b]``); each node carries its plugin's name, so one plugin may be placed under other
keys too (``+reward@reward.brevity=python``). The run's sections are the dataclasses of grpo_kit/config/schema.py.
"""

import logging
from typing import Any

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType
from omegaconf import DictConfig, OmegaConf, open_dict

from grpo_kit.config.compatibility import check_compatibility
from grpo_kit.config.overrides import check_choices, chosen_names, no_reward
from grpo_kit.config.presets import PRESET_FOR_PATH, PRESETS_MODULE
from grpo_kit.config.schema import DEFAULT_CHOICES, GradientDiagnosticsConfig, RunConfig, named_plugin_config
from grpo_kit.contract.distributed import is_main_process
from grpo_kit.contract.errors import PluginError
from grpo_kit.contract.kinds import KINDS, MULTI_CHOICE_KINDS, OPTIONAL_KINDS
from grpo_kit.plugins.registry import Registry

log = logging.getLogger(__name__)

PRIMARY_CONFIG = "grpo_kit"
SINGLE_CHOICE_KINDS = [kind for kind in KINDS if kind not in MULTI_CHOICE_KINDS]


def store_configs(registry: Registry) -> None:
    """Put the primary config and every installed plugin's config into Hydra's ConfigStore."""
    store = ConfigStore.instance()
    for kind in KINDS:
        store.repo.pop(kind, None)  # forget plugins of an earlier registry
        for plugin in registry.plugins(kind):
            node = named_plugin_config(plugin.config, plugin.name)
            if kind in MULTI_CHOICE_KINDS:
                store.store(group=kind, name=plugin.name, node=node, package=f"{kind}.{plugin.name}")
            else:
                store.store(group=kind, name=plugin.name, node=node)
    store_instruments(store, registry)
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


def store_instruments(store: ConfigStore, registry: Registry) -> None:
    """Every loss at shadow.NAME (`+shadow=[cispo,grpo]`), and the gradient diagnostics (`+diagnostics=gradient`)."""
    store.repo.pop("shadow", None)
    for plugin in registry.plugins("loss"):
        node = named_plugin_config(plugin.config, plugin.name)
        store.store(group="shadow", name=plugin.name, node=node, package=f"shadow.{plugin.name}")
    store.store(group="diagnostics", name="gradient", node=GradientDiagnosticsConfig)


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
    return [name for override in overrides if override.key_or_group == group for name in chosen_names(override)]


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


def note_default_loss(cfg: DictConfig, overrides: list[str] | tuple[str, ...]) -> None:
    """Say so when the loss is the default one because the command line named none (`+loss=dapo` names it)."""
    named = any(
        override.key_or_group == "loss" for override in OverridesParser.create().parse_overrides(list(overrides))
    )
    # Every process of a multi-process launch composes the config; one says so.
    if cfg.loss.name == DEFAULT_CHOICES["loss"] and not named and is_main_process():
        log.info("loss: %s, the default (choose another with +loss=NAME)", cfg.loss.name)


def options(node: DictConfig) -> dict:
    """A plugin node's option values, resolved, without the `name` the core added; `Registry.build` makes the
    plugin's config dataclass of them."""
    values = OmegaConf.to_container(node, resolve=True)
    values.pop("name", None)
    return values
