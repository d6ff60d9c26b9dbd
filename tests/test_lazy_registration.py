"""Plugins registered by import path: imported only when built, with the traits the core reads declared once."""

import sys

import pytest

from grpo_kit.contract.errors import PluginError
from grpo_kit.contract.kinds import declared
from grpo_kit.plugins.registry import Registry, plugin_manager

LOSS_MODULE = """
    from grpo_kit_losses.dapo import DAPO

    class SequenceDAPO(DAPO):
        pass  # its traits are its registration's

    class SaysItsLevel(DAPO):
        importance_sampling_level = "sequence"
"""


@pytest.fixture
def registry_of(local_plugin, monkeypatch):
    """A registry of one plugin module whose register_losses hook runs `registrations`."""
    for module in ("lazy_losses", "lazy_plugin"):  # written afresh by each test
        monkeypatch.delitem(sys.modules, module, raising=False)

    def registry(registrations: str) -> Registry:
        local_plugin("lazy_losses", LOSS_MODULE)
        module = local_plugin(
            "lazy_plugin",
            f"""
            import grpo_kit
            from grpo_kit_losses.configs import ClippedConfig

            @grpo_kit.hookimpl
            def register_losses(register):
                {registrations}
        """,
        )
        return Registry(plugin_manager(autoload=False, local_modules=[module], disabled=[]))

    return registry


def test_the_implementation_is_imported_when_first_built_and_carries_the_registered_traits(registry_of):
    registration = (
        'register("lazy", "lazy_losses:SequenceDAPO", ClippedConfig, importance_sampling_level="sequence", '
        "accumulation_invariant=True)"
    )
    registry = registry_of(registration)
    plugin = registry.get("loss", "lazy")
    assert plugin.implementation_path == "lazy_losses:SequenceDAPO" and "lazy_losses" not in sys.modules
    assert plugin.traits == {
        "importance_sampling_level": "sequence",
        "rollout_correction_levels": None,
        "accumulation_invariant": True,
    }
    loss = registry.build("loss", "lazy", {})
    assert type(loss).__name__ == "SequenceDAPO"
    # What the run was checked with is what the core reads of the built loss.
    assert {trait: declared(loss, "loss", trait) for trait in plugin.traits} == plugin.traits


def test_a_class_registered_as_such_says_its_own_traits(registry_of):
    registry = registry_of('from lazy_losses import SaysItsLevel; register("eager", SaysItsLevel, ClippedConfig)')
    assert registry.get("loss", "eager").traits["importance_sampling_level"] == "sequence"
    assert declared(registry.build("loss", "eager", {}), "loss", "importance_sampling_level") == "sequence"


def test_a_trait_declared_both_to_register_and_on_the_class_is_refused(registry_of):
    message = r"declares importance_sampling_level twice: to `register`, and as attributes of lazy_losses:SaysItsLevel"
    with pytest.raises(PluginError, match=message):
        registry_of(
            "from lazy_losses import SaysItsLevel; "
            'register("eager", SaysItsLevel, ClippedConfig, importance_sampling_level="sequence")'
        )


def test_a_class_registered_by_path_that_sets_a_trait_fails_at_build(registry_of):
    # Whatever the registration says, the class's attribute would be a second declaration the run never checked.
    registry = registry_of('register("lazy", "lazy_losses:SaysItsLevel", ClippedConfig, accumulation_invariant=True)')
    message = r"lazy_losses:SaysItsLevel sets importance_sampling_level as attributes: remove them from the class"
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
