"""Plugin discovery: the ``grpo_kit`` entry-point group, local modules, a block list, one registry per kind.

Built-in plugins come through the same entry-point group as third-party ones; nothing here knows their names.
"""

import dataclasses
import importlib
import importlib.metadata
import inspect
import os
from dataclasses import dataclass
from typing import Any

import pluggy

from grpo_kit import hookspecs
from grpo_kit.kinds import KINDS, GenerationConfig, RewardConfig

ENTRY_POINT_GROUP = "grpo_kit"

REGISTER_HOOK_OF_KIND = {
    "loss": "register_losses",
    "importance_sampling": "register_importance_sampling",
    "rollout_correction": "register_rollout_corrections",
    "advantage": "register_advantages",
    "reward": "register_rewards",
    "generation": "register_generations",
    "hook": "register_hooks",
}

# The core reads these fields, so a plugin of that kind must carry them.
_REQUIRED_CONFIG_BASE = {"reward": RewardConfig, "generation": GenerationConfig}


class PluginError(Exception):
    """A plugin could not be found, loaded or registered; the message says which and how to fix it."""


@dataclass(frozen=True)
class Plugin:
    kind: str
    name: str
    implementation: Any
    config: type  # a dataclass: the plugin's options and their defaults
    distribution: str  # "grpo-kit-losses 0.1.0", or "local module mylab.losses"


class PluginManager(pluggy.PluginManager):
    """pluggy's manager, plus where each plugin module came from and which plugin names are blocked."""

    def __init__(self, disabled_names=()):
        super().__init__("grpo_kit")
        self.add_hookspecs(hookspecs)
        self.distributions: dict[str, str] = {}  # plugin module's registered name -> "dist version"
        self.disabled_names = frozenset(disabled_names)


def plugin_manager(
    autoload: bool | None = None, local_modules: list[str] | None = None, disabled: list[str] | None = None
) -> PluginManager:
    """A fresh PluginManager holding every installed plugin module.

    Defaults come from the environment: GRPO_KIT_DISABLE_PLUGIN_AUTOLOAD=1 turns entry points off,
    GRPO_KIT_PLUGINS=pkg.mod,... adds local modules, GRPO_KIT_DISABLE_PLUGINS=name,... blocks plugin names.
    """
    if autoload is None:
        autoload = os.environ.get("GRPO_KIT_DISABLE_PLUGIN_AUTOLOAD", "") not in ("1", "true", "True")
    if local_modules is None:
        local_modules = _env_list("GRPO_KIT_PLUGINS")
    pm = PluginManager(_env_list("GRPO_KIT_DISABLE_PLUGINS") if disabled is None else disabled)
    if autoload:
        for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            _register_entry_point(pm, entry_point)
    for module_name in local_modules:
        try:
            module = importlib.import_module(module_name)
        except Exception as error:
            raise PluginError(f"GRPO_KIT_PLUGINS names {module_name!r}, which failed to import: {error!r}") from error
        pm.register(module, name=module_name)
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as error:
        raise PluginError(f"{error} (grpo_kit hooks: {', '.join(REGISTER_HOOK_OF_KIND.values())})") from error
    return pm


def _register_entry_point(pm: PluginManager, entry_point) -> None:
    distribution = f"{entry_point.dist.name} {entry_point.dist.version}" if entry_point.dist else "unknown"
    try:
        module = entry_point.load()
    except Exception as error:
        raise PluginError(
            f"The grpo_kit entry point {entry_point.name!r} = {entry_point.value!r} of distribution "
            f"{distribution} failed to load: {error!r}. Reinstall or uninstall that distribution."
        ) from error
    if pm.is_registered(module):
        return
    pm.register(module, name=entry_point.name)
    pm.distributions[entry_point.name] = distribution


class Registry:
    """Every registered plugin, by kind and name."""

    def __init__(self, pm: PluginManager | None = None):
        pm = pm or plugin_manager()
        self.plugin_manager = pm  # the run's pipeline hooks are called through it
        self._plugins: dict[str, dict[str, Plugin]] = {kind: {} for kind in KINDS}
        for kind in KINDS:
            for hookimpl in getattr(pm.hook, REGISTER_HOOK_OF_KIND[kind]).get_hookimpls():
                module_name = pm.get_name(hookimpl.plugin)
                distribution = pm.distributions.get(module_name, f"local module {module_name}")

                def register(name, implementation, config=None, *, kind=kind, distribution=distribution):
                    self._add(kind, name, implementation, config, distribution, pm.disabled_names)

                hookimpl.function(register=register)

    def _add(self, kind, name, implementation, config, distribution, disabled) -> None:
        if name in disabled:
            return
        if config is None:
            config = _REQUIRED_CONFIG_BASE.get(kind) or dataclasses.make_dataclass(f"{name}_config", [])
        base = _REQUIRED_CONFIG_BASE.get(kind)
        if not dataclasses.is_dataclass(config) or (base and not issubclass(config, base)):
            needs = f"a dataclass extending grpo_kit.{base.__name__}" if base else "a dataclass"
            raise PluginError(f"{kind} plugin {name!r} from {distribution}: its config must be {needs}, got {config!r}")
        existing = self._plugins[kind].get(name)
        if existing is not None:
            raise PluginError(
                f"Two {kind} plugins are named {name!r}: one from {existing.distribution}, one from {distribution}. "
                "Uninstall one of them, or block one with GRPO_KIT_DISABLE_PLUGINS."
            )
        self._plugins[kind][name] = Plugin(kind, name, implementation, config, distribution)

    def kinds(self) -> list[str]:
        return list(self._plugins)

    def names(self, kind: str) -> list[str]:
        return sorted(self._plugins[kind])

    def plugins(self, kind: str) -> list[Plugin]:
        return [self._plugins[kind][name] for name in self.names(kind)]

    def get(self, kind: str, name: str) -> Plugin:
        try:
            return self._plugins[kind][name]
        except KeyError:
            installed = ", ".join(self.names(kind)) or "none"
            raise PluginError(
                f"No {kind} plugin named {name!r} is installed (installed: {installed}). "
                "Is the distribution that provides it installed in this environment? `grpo-kit plugins` lists them."
            ) from None

    def build(self, kind: str, name: str, options: Any) -> Any:
        """The plugin's object, built with its typed config (a reward function comes back bound to its options)."""
        plugin = self.get(kind, name)
        config = options if isinstance(options, plugin.config) else plugin.config(**options)
        if inspect.isclass(plugin.implementation):
            return plugin.implementation(config)
        return _bind_options(plugin.implementation, config)


def _bind_options(function, config):
    options = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name not in _BASE_FIELDS}

    def bound(*args, **kwargs):
        return function(*args, **options, **kwargs)

    bound.__name__ = getattr(function, "__name__", "reward")
    bound.function, bound.options = function, options  # for the check of the dataset columns it needs
    bound.is_coroutine = inspect.iscoroutinefunction(function)
    return bound


_BASE_FIELDS = {f.name for f in dataclasses.fields(RewardConfig)}


def _env_list(variable: str) -> list[str]:
    return [item.strip() for item in os.environ.get(variable, "").split(",") if item.strip()]
