"""Discovery: entry points, local modules, the block list, and the errors a plugin author meets."""

import importlib.metadata
import pytest

from grpo_kit.plugins import PluginError, Registry, plugin_manager

BUILT_INS = {
    "loss": {"grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"},
    "importance_sampling": {"token", "sequence"},
    "rollout_correction": {"none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"},
    "advantage": {"group", "batch", "none", "gdpo", "rloo"},
    "reward": {"accuracy"},
    "generation": {"transformers"},
}


def test_built_ins_come_through_entry_points(registry):
    for kind, names in BUILT_INS.items():
        assert names <= set(registry.names(kind)), kind
    assert registry.get("loss", "dapo").distribution.startswith("grpo-kit-losses ")


def test_each_registry_has_its_own_plugin_manager(local_plugin):
    module = local_plugin("extra_loss", """
        import grpo_kit
        from grpo_kit_losses.dapo import DAPO

        @grpo_kit.hookimpl
        def register_losses(register):
            register("extra", DAPO)
    """)
    assert "extra" in Registry(plugin_manager(local_modules=[module])).names("loss")
    assert "extra" not in Registry(plugin_manager(local_modules=[])).names("loss")


def test_local_module_from_environment(local_plugin, monkeypatch):
    module = local_plugin("env_reward", """
        import grpo_kit

        def always_one(prompts, completions, completion_ids, **columns):
            return [1.0] * len(completions)

        @grpo_kit.hookimpl
        def register_rewards(register):
            register("always_one", always_one)
    """)
    monkeypatch.setenv("GRPO_KIT_PLUGINS", module)
    plugin = Registry().get("reward", "always_one")
    assert plugin.distribution == f"local module {module}"


def test_duplicate_name_names_both_distributions(local_plugin):
    module = local_plugin("clashing_loss", """
        import grpo_kit
        from grpo_kit_losses.grpo import GRPO

        @grpo_kit.hookimpl
        def register_losses(register):
            register("dapo", GRPO)
    """)
    with pytest.raises(PluginError, match=r"Two loss plugins are named 'dapo'.*grpo-kit-losses.*local module clashing_loss"):
        Registry(plugin_manager(local_modules=[module]))


def test_blocked_name_resolves_a_clash(local_plugin, monkeypatch):
    module = local_plugin("clashing_loss2", """
        import grpo_kit
        from grpo_kit_losses.grpo import GRPO

        @grpo_kit.hookimpl
        def register_losses(register):
            register("dapo", GRPO)
    """)
    monkeypatch.setenv("GRPO_KIT_DISABLE_PLUGINS", "dapo")
    registry = Registry(plugin_manager(local_modules=[module]))
    assert "dapo" not in registry.names("loss") and "grpo" in registry.names("loss")


def test_unknown_name_lists_installed_choices(registry):
    with pytest.raises(PluginError, match=r"No loss plugin named .nope.*installed: bnpo, cispo, dapo.*installed"):
        registry.get("loss", "nope")


def test_autoload_off_leaves_only_local_modules(local_plugin, monkeypatch):
    monkeypatch.setenv("GRPO_KIT_DISABLE_PLUGIN_AUTOLOAD", "1")
    registry = Registry(plugin_manager(local_modules=[]))
    assert all(registry.names(kind) == [] for kind in BUILT_INS)


def test_hook_with_a_misspelled_name_is_rejected(local_plugin):
    module = local_plugin("misspelled_hook", """
        import grpo_kit

        @grpo_kit.hookimpl
        def register_loss(register):
            pass
    """)
    with pytest.raises(PluginError, match="register_loss"):
        plugin_manager(local_modules=[module])


def test_local_module_that_fails_to_import_is_named(local_plugin):
    module = local_plugin("broken_plugin", "import not_a_real_package_xyz\n")
    with pytest.raises(PluginError, match=r"GRPO_KIT_PLUGINS names 'broken_plugin'.*not_a_real_package_xyz"):
        plugin_manager(local_modules=[module])


def test_reward_config_must_extend_reward_config(local_plugin):
    module = local_plugin("bad_reward_config", """
        from dataclasses import dataclass
        import grpo_kit

        @dataclass
        class Options:
            scale: float = 1.0

        @grpo_kit.hookimpl
        def register_rewards(register):
            register("scaled", lambda **kwargs: [], Options)
    """)
    with pytest.raises(PluginError, match=r"reward plugin 'scaled'.*must be a dataclass extending grpo_kit.RewardConfig"):
        Registry(plugin_manager(local_modules=[module]))


def without_distribution(monkeypatch, distribution: str) -> None:
    """Make importlib.metadata report the grpo_kit entry points as if `distribution` were uninstalled."""
    installed = importlib.metadata.entry_points

    def entry_points(**selection):
        return [ep for ep in installed(**selection) if ep.dist is None or ep.dist.name != distribution]

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)


def test_uninstalling_a_distribution_removes_only_its_names(monkeypatch):
    full = Registry(plugin_manager(local_modules=[]))
    without_distribution(monkeypatch, "grpo-kit-losses")
    reduced = Registry(plugin_manager(local_modules=[]))
    others = [name for name in full.names("loss") if not full.get("loss", name).distribution.startswith("grpo-kit-losses ")]
    assert reduced.names("loss") == others  # a third-party loss distribution, when one is installed, stays
    for kind in BUILT_INS:
        if kind != "loss":
            assert reduced.names(kind) == full.names(kind)
    with pytest.raises(PluginError, match="No loss plugin named 'grpo'"):
        reduced.get("loss", "grpo")


def test_entry_point_that_fails_to_import_names_itself_its_distribution_and_the_cause(monkeypatch):
    installed = importlib.metadata.entry_points
    losses = next(ep for ep in installed(group="grpo_kit") if ep.value == "grpo_kit_losses.plugin")
    broken = importlib.metadata.EntryPoint("mylab", "mylab_missing.plugin", "grpo_kit")
    broken = broken._for(losses.dist)  # as if the losses distribution declared it

    monkeypatch.setattr(importlib.metadata, "entry_points", lambda **selection: [*installed(**selection), broken])
    with pytest.raises(
        PluginError,
        match=r"entry point 'mylab' = 'mylab_missing.plugin' of distribution grpo-kit-losses 0\.1\.0 failed to load: "
        r"ModuleNotFoundError\(\"No module named 'mylab_missing'\"\)",
    ):
        plugin_manager(local_modules=[])
