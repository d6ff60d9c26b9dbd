"""What every plugin does, whatever its kind: it is built from its config, its config survives Hydra's round trip,
and registering it imports no torch. Every kind's suite subclasses `PluginContract`.
"""

import dataclasses
import functools
import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap
import types
from collections.abc import Sequence
from typing import Any, ClassVar

import pytest
from omegaconf import OmegaConf

from grpo_kit.config.compose import hydra_composition, options
from grpo_kit.contract.hookspecs import hookimpl
from grpo_kit.contract.kinds import KINDS, MULTI_CHOICE_KINDS, GenerationConfig
from grpo_kit.plugins.inventory import split_distribution
from grpo_kit.plugins.registry import ENTRY_POINT_GROUP, REGISTER_HOOK_OF_KIND, Plugin, Registry, plugin_manager


@dataclasses.dataclass(frozen=True)
class ContractCase:
    """One plugin under test: its registry and its name there."""

    registry: Registry
    kind: str
    name: str

    @property
    def plugin(self) -> Plugin:
        return self.registry.get(self.kind, self.name)

    def __repr__(self) -> str:
        return f"{self.kind} plugin {self.name!r}"


class PluginContract:
    """What every plugin does: it is built from its config, and its config survives Hydra's round trip."""

    kind: ClassVar[str]
    plugin_name: ClassVar[str | None] = None
    plugin_names: ClassVar[Sequence[str]] = ()
    implementation: ClassVar[Any] = None
    config: ClassVar[Any] = None  # the config dataclass, or an instance of it
    traits: ClassVar[dict] = {}  # with `implementation`: what its registration declares (accumulation_invariant=...)
    options: ClassVar[dict] = {}

    # --- how the subject is found and built ---

    def pytest_generate_tests(self, metafunc):
        if "contract_case" in metafunc.fixturenames:
            cases = self.contract_cases()
            metafunc.parametrize("contract_case", cases, ids=[case.name for case in cases], scope="class")

    @classmethod
    def contract_cases(cls) -> list[ContractCase]:
        """The plugins this class checks; found once per class (pytest asks for each test method)."""
        if "_contract_cases" not in cls.__dict__:
            cls._contract_cases = cls._find_contract_cases()
        return cls._contract_cases

    @classmethod
    def _find_contract_cases(cls) -> list[ContractCase]:
        if cls.implementation is not None:
            name = cls.plugin_name or getattr(cls.implementation, "__name__", "plugin_under_test")
            registry = _registry_of_one(cls.kind, name, cls.implementation, cls._config_class(), cls.traits)
            return [ContractCase(registry, cls.kind, name)]
        names = list(cls.plugin_names) or ([cls.plugin_name] if cls.plugin_name else [])
        if not names:
            raise TypeError(
                f"{cls.__name__} names no plugin: set plugin_name = 'NAME' (an installed {cls.kind} plugin), "
                f"plugin_names = [...], or implementation = YourClass and config = YourConfig."
            )
        registry = Registry()  # what a run sees, GRPO_KIT_PLUGINS and the block list included
        return [ContractCase(registry, cls.kind, name) for name in names]

    @classmethod
    def _config_class(cls):
        if cls.config is None or isinstance(cls.config, type):
            return cls.config
        return type(cls.config)

    @pytest.fixture(scope="class")
    @classmethod
    def plugin_options(cls, contract_case) -> dict:
        """Config fields to set; override this fixture when a value needs another fixture."""
        return dict(cls.options)

    @pytest.fixture(scope="class")
    @classmethod
    def plugin_config(cls, contract_case, plugin_options):
        """The config instance the plugin is built with."""
        if cls.config is not None and not isinstance(cls.config, type):
            return dataclasses.replace(cls.config, **plugin_options)
        return contract_case.plugin.config(**plugin_options)

    @pytest.fixture(scope="class")
    @classmethod
    def plugin(cls, contract_case, plugin_config):
        """The built plugin, as a run builds it."""
        return contract_case.registry.build(contract_case.kind, contract_case.name, plugin_config)

    # --- the contract every kind shares ---

    def test_config_round_trips_through_hydra(self, contract_case, plugin_config):
        """The config takes a run's way: stored in Hydra's ConfigStore, composed with `+KIND=NAME`, set as the
        command line sets it, read with `grpo_kit.config.compose.options` and typed by the registry. Every field
        must be a type OmegaConf can hold, and the plugin must be built with the values set, nested dataclasses
        included."""
        kind, name = contract_case.kind, contract_case.name
        cfg = hydra_composition([f"+{kind}={name}"], contract_case.registry)
        if cfg.generation is None:  # a run always has a backend, whose options a default may interpolate
            cfg.generation = OmegaConf.structured(GenerationConfig)
        node = cfg[kind][name] if kind in MULTI_CHOICE_KINDS else cfg[kind]
        node.merge_with(OmegaConf.to_container(OmegaConf.structured(plugin_config), resolve=False))
        back = contract_case.registry.config_instance(kind, name, options(node))
        # A default such as ${generation.max_completion_length} comes back resolved against the run's config.
        interpolated = {key: getattr(back, key) for key in node if OmegaConf.is_interpolation(node, key)}
        expected = dataclasses.replace(plugin_config, **interpolated)
        assert back == expected, f"{contract_case}: {expected} came back from a composed run as {back}"

    def test_registration_imports_no_torch(self, contract_case):
        """`grpo-kit plugins`, the CLI's help and errors, and `grpo_kit.compose` import every installed plugin's
        entry-point module and register its plugins: in a fresh process, neither may import torch."""
        if self.implementation is not None:
            pytest.skip("not installed yet: `implementation = ...` has no entry-point module")
        for module in _entry_point_modules(contract_case.plugin.distribution):
            torch_came_with = _what_imports_torch(module)
            assert torch_came_with is None, (
                f"{torch_came_with} imports torch, which then loads with every grpo-kit command and every composed "
                "run. Register the implementation by its import path, register(name, 'package.module:Class', Config), "
                "keep the config dataclass in a module that does not import torch, and declare the traits the core "
                f"reads to `register` (docs/plugins/README.md). `python -X importtime -c 'import {module}'` shows "
                "what imports it."
            )


def _entry_point_modules(distribution: str) -> list[str]:
    """The modules that register a distribution's plugins ("local module X": X itself)."""
    name, _ = split_distribution(distribution)
    if name.startswith("local module "):
        return [name.removeprefix("local module ")]
    entry_points = importlib.metadata.distribution(name).entry_points.select(group=ENTRY_POINT_GROUP)
    return sorted({entry_point.module for entry_point in entry_points})


_TORCH_CHECK = textwrap.dedent("""
    import json, sys
    module = sys.argv[1]
    __import__(module)
    on_import = "torch" in sys.modules
    from grpo_kit.plugins.inventory import installed_plugins
    from grpo_kit.plugins.registry import Registry, plugin_manager
    installed_plugins(Registry(plugin_manager(autoload=False, local_modules=[module], disabled=[])))
    print(json.dumps({"on_import": on_import, "on_registration": "torch" in sys.modules}))
""")


@functools.cache  # one fresh process per module, however many plugins and suites it has
def _what_imports_torch(module: str) -> str | None:
    """What, in a fresh process, imports torch: importing `module`, or registering its plugins; None: neither."""
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in sys.path if path)}  # local modules too
    child = subprocess.run(
        [sys.executable, "-c", _TORCH_CHECK, module], capture_output=True, text=True, env=environment
    )
    if child.returncode != 0:
        raise AssertionError(f"Registering the plugins of {module} in a fresh process failed:\n{child.stderr}")
    found = json.loads(child.stdout.splitlines()[-1])
    if found["on_import"]:
        return f"Importing {module}"
    if found["on_registration"]:
        return f"Registering the plugins of {module} (its register_* hooks, or the classes they import)"
    return None


def _registry_of_one(kind: str, name: str, implementation, config, traits: dict) -> Registry:
    """A registry holding only `implementation`, registered through a plugin module as an entry point would be."""
    if kind not in REGISTER_HOOK_OF_KIND:
        raise TypeError(f"Unknown plugin kind {kind!r}: one of {', '.join(KINDS)}.")

    def register_one(register):
        register(name, implementation, config, **traits)

    module = types.SimpleNamespace(**{REGISTER_HOOK_OF_KIND[kind]: hookimpl(register_one)})
    pm = plugin_manager(autoload=False, local_modules=[], disabled=[])
    pm.register(module, name=f"contract test of {name}")
    return Registry(pm)
