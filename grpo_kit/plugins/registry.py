"""Plugin discovery: the ``grpo_kit`` entry-point group, local modules, a block list, one registry per kind.

Built-in plugins come through the same entry-point group as third-party ones; nothing here knows their names.
A plugin registered by import path ("package.module:Name") is imported only when a run builds it, so that listing
the plugins and composing a run import none of them, nor torch.
"""

import dataclasses
import functools
import importlib
import importlib.metadata
import inspect
import logging
import os
import re
from dataclasses import dataclass
from typing import Any, Protocol

import pluggy
from omegaconf import OmegaConf, SCMode
from omegaconf.errors import MissingMandatoryValue

from grpo_kit.contract import hookspecs, kinds
from grpo_kit.contract.errors import ConfigError, PluginError
from grpo_kit.contract.kinds import KINDS, MULTI_CHOICE_KINDS, PROTOCOLS, GenerationConfig, RewardConfig

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "grpo_kit"

REGISTER_HOOK_OF_KIND = {
    "loss": "register_losses",
    "importance_sampling": "register_importance_sampling",
    "rollout_correction": "register_rollout_corrections",
    "advantage": "register_advantages",
    "reward": "register_rewards",
    "generation": "register_generations",
    "hook": "register_hooks",
    "environment": "register_environments",
    "rollout": "register_rollouts",
    "sampler": "register_samplers",
}

# The core reads these fields, so a plugin of that kind must carry them.
_REQUIRED_CONFIG_BASE = {"reward": RewardConfig, "generation": GenerationConfig}

# kinds.TRAITS with their defaults: what a plugin of each kind has when it says nothing.
TRAITS = {kind: {name: getattr(PROTOCOLS[kind], name) for name in names} for kind, names in kinds.TRAITS.items()}

_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")  # package.module:Name


@dataclass(frozen=True)
class Plugin:
    kind: str
    name: str
    target: Any  # what was registered: the implementation, or its import path "package.module:Name"
    config: type  # a dataclass: the plugin's options and their defaults
    distribution: str  # "grpo-kit-losses 0.1.0", or "local module mylab.losses"
    traits: dict[str, Any]  # TRAITS of its kind, by name

    @property
    def implementation_path(self) -> str:
        """ "package.module:Name", known without importing the implementation."""
        return self.target if isinstance(self.target, str) else qualified_name(self.target)

    @functools.cached_property
    def implementation(self) -> Any:
        """The class (or reward function), imported on first use when it was registered by import path."""
        if not isinstance(self.target, str):
            return self.target
        module_name, _, attribute = self.target.partition(":")
        try:
            return functools.reduce(getattr, attribute.split("."), importlib.import_module(module_name))
        except Exception as error:
            raise PluginError(
                f"The {self.kind} plugin {self.name!r} from {self.distribution} is implemented by {self.target}, "
                f"which failed to load: {error!r}. Reinstall that distribution, or fix the import path it registers."
            ) from error


# The hooks a hook plugin's methods may implement (the register_* hooks are for plugin modules).
PIPELINE_HOOKS = sorted(name for name in vars(hookspecs) if name.startswith("on_"))


class PluginManager(pluggy.PluginManager):
    """pluggy's manager, plus where each plugin module came from and which plugin names are blocked."""

    def __init__(self, disabled_names=()):
        super().__init__("grpo_kit")
        self.add_hookspecs(hookspecs)
        self.distributions: dict[str, str] = {}  # plugin module's registered name -> "dist version"
        # Entry points that failed to import: why, by entry-point name. Their plugins are missing, so only a run
        # that selects one of them fails (Registry.get says why); every other command works.
        self.broken: dict[str, str] = {}
        # NAME blocks it in every kind, KIND:NAME in one; either with @DISTRIBUTION blocks only that distribution's.
        self.disabled_names = frozenset(disabled_names)
        for blocked in self.disabled_names:
            kind, _, name = blocked.partition("@")[0].rpartition(":")
            if (kind and kind not in KINDS) or not name or blocked.endswith("@"):
                raise PluginError(
                    f"GRPO_KIT_DISABLE_PLUGINS holds {blocked!r}, which is neither NAME (blocked in every kind) nor "
                    f"KIND:NAME with KIND one of {', '.join(KINDS)}, each optionally followed by @DISTRIBUTION: fix "
                    "that entry."
                )

    def is_disabled(self, kind: str, name: str, distribution: str) -> bool:
        """`distribution`: "grpo-kit-losses 0.1.0" or "local module mylab.losses"; its name is what @ matches."""
        source = _source(distribution)
        return any(
            entry in self.disabled_names
            for entry in (name, f"{kind}:{name}", f"{name}@{source}", f"{kind}:{name}@{source}")
        )


def plugin_manager(
    autoload: bool | None = None, local_modules: list[str] | None = None, disabled: list[str] | None = None
) -> PluginManager:
    """A fresh PluginManager holding every installed plugin module.

    Defaults come from the environment: GRPO_KIT_DISABLE_PLUGIN_AUTOLOAD=1 turns entry points off,
    GRPO_KIT_PLUGINS=pkg.mod,... adds local modules, GRPO_KIT_DISABLE_PLUGINS=name,kind:name,... blocks plugins
    by name in every kind, or in one kind.
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
        pm.broken[entry_point.name] = (
            f"the grpo_kit entry point {entry_point.name!r} = {entry_point.value!r} of distribution "
            f"{distribution} failed to load: {error!r}. Reinstall or uninstall that distribution"
        )
        log.warning("Skipped a broken plugin distribution: %s.", pm.broken[entry_point.name])
        return
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

                def register(name, implementation, config=None, *, kind=kind, distribution=distribution, **traits):
                    if not pm.is_disabled(kind, name, distribution):
                        self._add(kind, name, implementation, config, distribution, traits)

                hookimpl.function(register=register)

    def _add(self, kind, name, implementation, config, distribution, declared_traits) -> None:
        where = f"{kind} plugin {name!r} from {distribution}"
        if isinstance(implementation, str) and not _IMPORT_PATH.match(implementation):
            raise PluginError(
                f"The {where} is registered as {implementation!r}, which is not an import path: give the class "
                "(or function) itself, or its path written package.module:Name."
            )
        if config is None:
            config = _REQUIRED_CONFIG_BASE.get(kind) or dataclasses.make_dataclass(f"{name}_config", [])
        base = _REQUIRED_CONFIG_BASE.get(kind)
        if not dataclasses.is_dataclass(config) or (base and not issubclass(config, base)):
            needs = f"a dataclass extending grpo_kit.{base.__name__}" if base else "a dataclass"
            raise PluginError(f"{where}: its config must be {needs}, got {config!r}")
        if "name" in {f.name for f in dataclasses.fields(config)}:
            raise PluginError(
                f"{where}: its config {config.__qualname__} has a field `name`, "
                f"which the core's `{kind}.name` (the plugin's name) would hide: rename that field."
            )
        existing = self._plugins[kind].get(name)
        if existing is not None:
            raise PluginError(
                f"Two {kind} plugins are named {name!r}: one from {existing.distribution}, one from {distribution}. "
                f"Uninstall one of them, or block one with "
                f"GRPO_KIT_DISABLE_PLUGINS={kind}:{name}@{_source(distribution)} "
                f"(or {kind}:{name}@{_source(existing.distribution)})."
            )
        traits = _traits(where, kind, implementation, declared_traits)
        self._plugins[kind][name] = Plugin(kind, name, implementation, config, distribution, traits)

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
            broken = "".join(
                f" It may come from a distribution that failed to load: {why}."
                for why in self.plugin_manager.broken.values()
            )
            raise PluginError(
                f"No {kind} plugin named {name!r} is installed (installed: {installed}). "
                f"Is the distribution that provides it installed in this environment? `grpo-kit plugins` lists "
                f"them.{broken}"
            ) from None

    def build(self, kind: str, name: str, options: Any) -> Any:
        """The plugin's object, built with its typed config (a reward function comes back bound to its options).

        `options` is a config instance, or option values (`grpo_kit.config.compose.options(node)`), from which the
        config dataclass is built as Hydra types it: nested dataclasses become instances of their classes, not dicts.
        """
        plugin = self.get(kind, name)
        config = options if isinstance(options, plugin.config) else self.config_instance(kind, name, options)
        if isinstance(plugin.target, str):
            _refuse_attribute_traits(plugin)
        if not inspect.isclass(plugin.implementation):
            built = _bind_options(plugin.implementation, config)
        else:
            built = plugin.implementation(config) if _takes_config(plugin.implementation) else plugin.implementation()
        # The registration is where a trait is declared: the object has what the run was checked with.
        for trait, value in plugin.traits.items():
            setattr(built, trait, value)
        if kind == "hook":
            _check_hook_methods(plugin, built)
        return built

    def config_instance(self, kind: str, name: str, options: dict) -> Any:
        """The plugin's config dataclass holding `options`, typed as Hydra types them (nested dataclasses too)."""
        plugin = self.get(kind, name)
        node = OmegaConf.merge(OmegaConf.structured(plugin.config), options)
        try:
            # resolve=False: the values of a composed run are resolved already, and a default such as
            # ${generation.max_completion_length} resolves only inside a run's config.
            return OmegaConf.to_container(node, resolve=False, structured_config_mode=SCMode.INSTANTIATE)
        except MissingMandatoryValue as error:
            option = f"{kind}.{name}.{error.full_key}" if kind in MULTI_CHOICE_KINDS else f"{kind}.{error.full_key}"
            raise ConfigError(
                f"The {kind} plugin {name!r} ({plugin.distribution}) needs its option {error.full_key}, which has no "
                f"default: set it with {option}=VALUE."
            ) from None


def _traits(where: str, kind: str, implementation: Any, declared: dict) -> dict:
    """The TRAITS of a plugin of `kind`: as declared to `register`, or, for an implementation registered as such, as
    its attributes say; else the default. One source each: a trait declared both ways is an error."""
    defaults = TRAITS.get(kind, {})
    unknown = sorted(set(declared) - set(defaults))
    if unknown:
        known = f"a {kind} plugin declares only {', '.join(defaults)}" if defaults else f"a {kind} plugin has none"
        raise PluginError(f"The {where} is registered with {', '.join(unknown)}, which is no trait: {known}.")
    if isinstance(implementation, str):  # not imported: only the registration can say
        return {**defaults, **declared}
    attributes = _attribute_traits(kind, implementation)
    twice = sorted(set(attributes) & set(declared))
    if twice:
        raise PluginError(
            f"The {where} declares {', '.join(twice)} twice: to `register`, and as attributes of "
            f"{qualified_name(implementation)}. Declare each trait once: remove the attributes, or the keywords."
        )
    return {**defaults, **attributes, **declared}


def _attribute_traits(kind: str, implementation: Any) -> dict:
    """The traits `implementation` sets as attributes, itself or through a base class other than its kind's protocol
    (whose defaults are no declaration)."""
    owners = implementation.__mro__ if inspect.isclass(implementation) else (implementation,)
    return {
        trait: getattr(implementation, trait)
        for trait in TRAITS.get(kind, {})
        if any(trait in getattr(owner, "__dict__", {}) for owner in owners if owner is not PROTOCOLS[kind])
    }


def qualified_name(obj: Any) -> str:
    """ "package.module:QualifiedName" of a class, a function, or an instance's class."""
    module = getattr(obj, "__module__", None) or "?"
    return f"{module}:{getattr(obj, '__qualname__', type(obj).__qualname__)}"


def _takes_config(cls: type) -> bool:
    """Whether `cls(config)` is how to build it: a class whose __init__ takes nothing, or that inherits its
    __init__ from object or from a kind's protocol (grpo_kit.Loss, ...), is built without a config."""
    owner = next(klass for klass in cls.__mro__ if "__init__" in vars(klass))
    # Python 3.10 hides a protocol's __init__ behind (*args, **kwargs), and on a first call replaces a subclass's
    # inherited one with object.__init__: both take nothing.
    if Protocol in owner.__bases__ or vars(owner)["__init__"] is object.__init__:
        return False
    return bool(inspect.signature(cls).parameters)


def _refuse_attribute_traits(plugin: Plugin) -> None:
    """A plugin registered by import path has its traits from `register` alone: the run was composed and checked
    before its class was imported, so a trait the class sets as well would be a second, unread declaration."""
    attributes = _attribute_traits(plugin.kind, plugin.implementation)
    if attributes:
        keywords = ", ".join(f"{trait}={value!r}" for trait, value in attributes.items())
        raise PluginError(
            f"The {plugin.kind} plugin {plugin.name!r} (from {plugin.distribution}) is registered by its import path, "
            f"so its traits are declared to `register` alone, but {plugin.implementation_path} sets "
            f"{', '.join(attributes)} as attributes: remove them from the class, and declare to `register` those that "
            f"differ from the default ({keywords})."
        )


def _check_hook_methods(plugin: Plugin, hook: Any) -> None:
    """Fail on a method named like a pipeline hook that the run would never call: unmarked, misspelt, or taking
    arguments its hook does not pass. pluggy would skip the first two in silence."""
    where = f"The hook plugin {plugin.name!r} ({_class_path(hook)}, from {plugin.distribution})"
    checker = PluginManager()
    for method in [name for name in dir(hook) if name.startswith("on_") and callable(getattr(hook, name))]:
        if method not in PIPELINE_HOOKS:
            raise PluginError(
                f"{where} has a method {method!r}, which is no grpo_kit hook: rename it to one of "
                f"{', '.join(PIPELINE_HOOKS)}, or give a helper a name that does not start with on_."
            )
        if checker.parse_hookimpl_opts(hook, method) is None:
            raise PluginError(
                f"{where} does not mark its method {method!r} with @grpo_kit.hookimpl, so the run would never call "
                f"it: put @grpo_kit.hookimpl on the line above `def {method}`."
            )
    try:
        checker.register(hook)
    except pluggy.PluginValidationError as error:
        pluggy_says = str(error).replace("\n", "; ")
        raise PluginError(
            f"{where} does not fit grpo_kit's hooks: {pluggy_says}. The hooks are in grpo_kit/contract/hookspecs.py."
        ) from None


def _class_path(obj: Any) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def _bind_options(function, config):
    options = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name not in _BASE_FIELDS}

    def bound(*args, **kwargs):
        return function(*args, **options, **kwargs)

    bound.__name__ = getattr(function, "__name__", "reward")
    bound.function, bound.options = function, options  # for the check of the dataset columns it needs
    bound.is_coroutine = inspect.iscoroutinefunction(function)
    return bound


_BASE_FIELDS = {f.name for f in dataclasses.fields(RewardConfig)}


def _source(distribution: str) -> str:
    """What GRPO_KIT_DISABLE_PLUGINS's @ names: the distribution's name, or a local module's."""
    return distribution.removeprefix("local module ").split(" ")[0]


def _env_list(variable: str) -> list[str]:
    return [item.strip() for item in os.environ.get(variable, "").split(",") if item.strip()]
