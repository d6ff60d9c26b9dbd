"""Plugins registered by import path: imported only when built, with the traits the core reads declared."""

import sys

import pytest

from grpo_kit.contract.errors import PluginError
from grpo_kit.plugins.registry import Registry, plugin_manager

LOSS_MODULE = """
    from grpo_kit_losses.dapo import DAPO

    class SequenceDAPO(DAPO):
        importance_sampling_level = "sequence"
"""


@pytest.fixture
def registry_of(local_plugin, monkeypatch):
    """A registry of one plugin module whose register_losses hook runs `registrations`."""
    for module in ("lazy_losses", "lazy_plugin"):  # written afresh by each test
        monkeypatch.delitem(sys.modules, module, raising=False)

    def registry(registrations: str) -> Registry:
        local_plugin("lazy_losses", LOSS_MODULE)
        module = local_plugin("lazy_plugin", f"""
            import grpo_kit
            from grpo_kit_losses.configs import ClippedConfig

            @grpo_kit.hookimpl
            def register_losses(register):
                {registrations}
        """)
        return Registry(plugin_manager(autoload=False, local_modules=[module], disabled=[]))

    return registry


def test_the_implementation_is_imported_when_first_built(registry_of):
    registration = (
        'register("lazy", "lazy_losses:SequenceDAPO", ClippedConfig, importance_sampling_level="sequence", '
        'accumulation_invariant=True)'
    )
    registry = registry_of(registration)
    plugin = registry.get("loss", "lazy")
    assert plugin.implementation_path == "lazy_losses:SequenceDAPO" and "lazy_losses" not in sys.modules
    assert plugin.traits == {
        "importance_sampling_level": "sequence", "rollout_correction_levels": None, "accumulation_invariant": True
    }
    assert type(registry.build("loss", "lazy", {})).__name__ == "SequenceDAPO"


def test_a_class_registered_as_such_says_its_own_traits(registry_of):
    registry = registry_of('from lazy_losses import SequenceDAPO; register("eager", SequenceDAPO, ClippedConfig)')
    assert registry.get("loss", "eager").traits["importance_sampling_level"] == "sequence"


def test_a_declared_trait_the_class_contradicts_fails_at_build(registry_of):
    registry = registry_of('register("lazy", "lazy_losses:SequenceDAPO", ClippedConfig)')  # the level: None
    message = r"with importance_sampling_level=None, but lazy_losses:SequenceDAPO has importance_sampling_level='sequence'"
    with pytest.raises(PluginError, match=message):
        registry.build("loss", "lazy", {})


def test_an_unknown_trait_is_rejected_at_registration(registry_of):
    message = r"with needs_groups, which is no trait: a loss plugin declares only importance_sampling_level, rollout_"
    with pytest.raises(PluginError, match=message):
        registry_of('register("lazy", "lazy_losses:SequenceDAPO", needs_groups=True)')


def test_a_malformed_path_is_rejected_at_registration(registry_of):
    with pytest.raises(PluginError, match=r"registered as 'lazy_losses.SequenceDAPO', which is not an import path"):
        registry_of('register("lazy", "lazy_losses.SequenceDAPO")')


@pytest.mark.parametrize("path", ["no_such_module_xyz:Loss", "lazy_losses:NoSuchLoss"])
def test_a_path_that_does_not_load_names_the_plugin(registry_of, path):
    registry = registry_of(f'register("lazy", {path!r})')
    message = rf"loss plugin 'lazy' from local module lazy_plugin is implemented by {path}, which failed to load"
    with pytest.raises(PluginError, match=message):
        registry.build("loss", "lazy", {})
