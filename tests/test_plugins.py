"""Discovery: entry points, local modules, the block list, and the errors a plugin author meets."""

import importlib.metadata
import re
from dataclasses import dataclass, field

import pytest

import grpo_kit
from grpo_kit.contract.errors import PluginError
from grpo_kit.contract.hookspecs import hookimpl
from grpo_kit.plugins.registry import Registry, plugin_manager
from grpo_kit.testing import tiny_run
from grpo_kit.testing.contracts import HookContract, LossContract

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
    module = local_plugin(
        "extra_loss",
        """
        import grpo_kit
        from grpo_kit_losses.dapo import DAPO

        @grpo_kit.hookimpl
        def register_losses(register):
            register("extra", DAPO)
    """,
    )
    assert "extra" in Registry(plugin_manager(local_modules=[module])).names("loss")
    assert "extra" not in Registry(plugin_manager(local_modules=[])).names("loss")


def test_local_module_from_environment(local_plugin, monkeypatch):
    module = local_plugin(
        "env_reward",
        """
        import grpo_kit

        def always_one(prompts, completions, completion_ids, **columns):
            return [1.0] * len(completions)

        @grpo_kit.hookimpl
        def register_rewards(register):
            register("always_one", always_one)
    """,
    )
    monkeypatch.setenv("GRPO_KIT_PLUGINS", module)
    plugin = Registry().get("reward", "always_one")
    assert plugin.distribution == f"local module {module}"


def test_duplicate_name_names_both_distributions(local_plugin):
    module = local_plugin(
        "clashing_loss",
        """
        import grpo_kit
        from grpo_kit_losses.grpo import GRPO

        @grpo_kit.hookimpl
        def register_losses(register):
            register("dapo", GRPO)
    """,
    )
    with pytest.raises(
        PluginError, match=r"Two loss plugins are named 'dapo'.*grpo-kit-losses.*local module clashing_loss"
    ):
        Registry(plugin_manager(local_modules=[module]))


def test_blocked_name_resolves_a_clash(local_plugin, monkeypatch):
    module = local_plugin(
        "clashing_loss2",
        """
        import grpo_kit
        from grpo_kit_losses.grpo import GRPO

        @grpo_kit.hookimpl
        def register_losses(register):
            register("dapo", GRPO)
    """,
    )
    monkeypatch.setenv("GRPO_KIT_DISABLE_PLUGINS", "dapo")
    registry = Registry(plugin_manager(local_modules=[module]))
    assert "dapo" not in registry.names("loss") and "grpo" in registry.names("loss")


def test_the_advice_of_a_clash_keeps_one_of_the_two(local_plugin, monkeypatch):
    module = local_plugin(
        "clashing_loss3",
        """
        import grpo_kit
        from grpo_kit_losses.grpo import GRPO

        @grpo_kit.hookimpl
        def register_losses(register):
            register("dapo", GRPO)
    """,
    )
    with pytest.raises(PluginError) as clash:
        Registry(plugin_manager(local_modules=[module]))
    advice = re.findall(r"loss:dapo@([\w.-]+)", str(clash.value))
    assert sorted(advice) == sorted(["grpo-kit-losses", module])
    for blocked, kept in zip(advice, reversed(advice)):
        monkeypatch.setenv("GRPO_KIT_DISABLE_PLUGINS", f"loss:dapo@{blocked}")
        registry = Registry(plugin_manager(local_modules=[module]))
        assert kept in registry.get("loss", "dapo").distribution


def test_unknown_name_lists_installed_choices(installed):
    with pytest.raises(PluginError, match=r"No loss plugin named .nope.*installed: .*installed") as error:
        installed.get("loss", "nope")
    listed = re.search(r"\(installed: ([^)]*)\)", str(error.value)).group(1).split(", ")
    assert BUILT_INS["loss"] <= set(listed)


def test_autoload_off_leaves_only_local_modules(local_plugin, monkeypatch):
    monkeypatch.setenv("GRPO_KIT_DISABLE_PLUGIN_AUTOLOAD", "1")
    registry = Registry(plugin_manager(local_modules=[]))
    assert all(registry.names(kind) == [] for kind in BUILT_INS)


def test_hook_with_a_misspelled_name_is_rejected(local_plugin):
    module = local_plugin(
        "misspelled_hook",
        """
        import grpo_kit

        @grpo_kit.hookimpl
        def register_loss(register):
            pass
    """,
    )
    with pytest.raises(PluginError, match="register_loss"):
        plugin_manager(local_modules=[module])


def test_local_module_that_fails_to_import_is_named(local_plugin):
    module = local_plugin("broken_plugin", "import not_a_real_package_xyz\n")
    with pytest.raises(PluginError, match=r"GRPO_KIT_PLUGINS names 'broken_plugin'.*not_a_real_package_xyz"):
        plugin_manager(local_modules=[module])


def test_reward_config_must_extend_reward_config(local_plugin):
    module = local_plugin(
        "bad_reward_config",
        """
        from dataclasses import dataclass
        import grpo_kit

        @dataclass
        class Options:
            scale: float = 1.0

        @grpo_kit.hookimpl
        def register_rewards(register):
            register("scaled", lambda **kwargs: [], Options)
    """,
    )
    with pytest.raises(
        PluginError, match=r"reward plugin 'scaled'.*must be a dataclass extending grpo_kit.RewardConfig"
    ):
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
    others = [
        name for name in full.names("loss") if not full.get("loss", name).distribution.startswith("grpo-kit-losses ")
    ]
    assert reduced.names("loss") == others  # a third-party loss distribution, when one is installed, stays
    for kind in BUILT_INS:
        if kind != "loss":
            assert reduced.names(kind) == full.names(kind)
    with pytest.raises(PluginError, match="No loss plugin named 'grpo'"):
        reduced.get("loss", "grpo")


def test_a_broken_entry_point_is_skipped_and_named_where_a_run_would_need_it(monkeypatch, caplog):
    installed = importlib.metadata.entry_points
    losses = next(ep for ep in installed(group="grpo_kit") if ep.value == "grpo_kit_losses.plugin")
    broken = importlib.metadata.EntryPoint("mylab", "mylab_missing.plugin", "grpo_kit")
    broken = broken._for(losses.dist)  # as if the losses distribution declared it
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda **selection: [*installed(**selection), broken])

    registry = Registry(plugin_manager(local_modules=[]))  # the other plugins, built-ins included, still load

    cause = (
        r"entry point 'mylab' = 'mylab_missing.plugin' of distribution grpo-kit-losses 0\.1\.0 failed to load: "
        r"ModuleNotFoundError\(\"No module named 'mylab_missing'\"\)"
    )
    assert re.search(cause, caplog.text)
    assert "dapo" in registry.names("loss")
    with pytest.raises(PluginError, match=rf"No loss plugin named 'mylab_loss'.*failed to load.*{cause}"):
        registry.get("loss", "mylab_loss")


def test_blocking_kind_and_name_blocks_that_kind_only(local_plugin, monkeypatch):
    module = local_plugin(
        "dapo_advantage",
        """
        import grpo_kit
        from grpo_kit_advantages.group import GroupAdvantage

        @grpo_kit.hookimpl
        def register_advantages(register):
            register("dapo", GroupAdvantage)
    """,
    )
    monkeypatch.setenv("GRPO_KIT_DISABLE_PLUGINS", "loss:dapo")
    registry = Registry(plugin_manager(local_modules=[module]))
    assert "dapo" not in registry.names("loss") and "dapo" in registry.names("advantage")
    monkeypatch.setenv("GRPO_KIT_DISABLE_PLUGINS", "dapo")
    registry = Registry(plugin_manager(local_modules=[module]))
    assert "dapo" not in registry.names("loss") and "dapo" not in registry.names("advantage")


def test_blocking_an_unknown_kind_is_named(monkeypatch):
    monkeypatch.setenv("GRPO_KIT_DISABLE_PLUGINS", "losses:dapo")
    with pytest.raises(
        PluginError,
        match=r"GRPO_KIT_DISABLE_PLUGINS holds 'losses:dapo', which is neither NAME .* "
        r"KIND:NAME with KIND one of loss, importance_sampling, ",
    ):
        plugin_manager()


HOOK_PLUGINS = """
    import grpo_kit

    class Unmarked:
        def __init__(self, config):
            pass

        def on_step_end(self, run, step, metrics):
            raise AssertionError("never called")

    class Misspelt:
        def __init__(self, config):
            pass

        @grpo_kit.hookimpl
        def on_step_ended(self, run, step, metrics):
            pass

    class WrongArguments:
        def __init__(self, config):
            pass

        @grpo_kit.hookimpl
        def on_log(self, run, step, metrics, extra):
            pass

    class Marked:
        def __init__(self, config):
            pass

        @grpo_kit.hookimpl
        def on_log(self, run, step, metrics):
            pass

    @grpo_kit.hookimpl
    def register_hooks(register):
        for hook in (Unmarked, Misspelt, WrongArguments, Marked):
            register(hook.__name__.lower(), hook)
"""


@pytest.fixture
def hook_registry(local_plugin):
    return Registry(plugin_manager(local_modules=[local_plugin("hook_plugins", HOOK_PLUGINS)]))


def test_hook_method_without_hookimpl_fails_when_built(hook_registry):
    with pytest.raises(
        PluginError,
        match=r"^The hook plugin 'unmarked' \(hook_plugins.Unmarked, from local module "
        r"hook_plugins\) does not mark its method 'on_step_end' with "
        r"@grpo_kit.hookimpl, so the run would never call it",
    ):
        hook_registry.build("hook", "unmarked", {})


def test_hook_method_that_is_no_hook_names_the_hooks(hook_registry):
    with pytest.raises(
        PluginError,
        match=r"'misspelt' \(hook_plugins.Misspelt.*has a method 'on_step_ended', which is "
        r"no grpo_kit hook: rename it to one of on_advantages, on_log, ",
    ):
        hook_registry.build("hook", "misspelt", {})
    with pytest.raises(PluginError, match=r"'wrongarguments'.*does not fit grpo_kit's hooks: .*extra"):
        hook_registry.build("hook", "wrongarguments", {})
    hook_registry.build("hook", "marked", {})


def test_run_with_an_unmarked_hook_fails_before_the_model_loads(hook_registry, tiny_model, tmp_path):
    cfg = grpo_kit.compose(tiny_run(tiny_model, "+reward=accuracy", "+hook=[marked,unmarked]"), hook_registry)
    with pytest.raises(PluginError, match="'unmarked'.*does not mark its method 'on_step_end'"):
        grpo_kit.train(cfg, tmp_path / "run", hook_registry)
    assert not (tmp_path / "run" / "config.yaml").exists()


@dataclass
class Window:
    size: int = 4


@dataclass
class WindowedConfig:
    window: Window = field(default_factory=Window)


class Windowed:
    def __init__(self, config: WindowedConfig):
        assert isinstance(config.window, Window), "a nested option reached the plugin as a dict"

    @hookimpl
    def on_log(self, run, step, metrics):
        pass


class TestNestedOptionsInTheConformanceKit(HookContract):
    """The kit's round trip composes the config as a run does, so a nested dataclass comes back as one."""

    implementation = Windowed
    config = WindowedConfig
    options = {"window": Window(size=8)}


def test_the_kit_registers_an_implementation_with_the_traits_its_registration_will_declare():
    from grpo_kit_losses.configs import ClippedConfig
    from grpo_kit_losses.dapo import DAPO

    class NotInstalledYet(LossContract):
        implementation = DAPO
        config = ClippedConfig
        traits = {"accumulation_invariant": True}

    case = NotInstalledYet.contract_cases()[0]
    assert case.plugin.traits["accumulation_invariant"] is True
    assert case.registry.build("loss", case.name, ClippedConfig()).accumulation_invariant is True


def test_a_config_field_called_name_is_refused(local_plugin):
    module = local_plugin(
        "named_field",
        """
        from dataclasses import dataclass
        import grpo_kit

        @dataclass
        class LabelConfig(grpo_kit.RewardConfig):
            name: str = "mine"

        @grpo_kit.hookimpl
        def register_rewards(register):
            register("label", lambda **kwargs: [], LabelConfig)
    """,
    )
    with pytest.raises(
        PluginError,
        match=r"reward plugin 'label' .*its config LabelConfig has a field `name`, which "
        r"the core's `reward.name` \(the plugin's name\) would hide",
    ):
        Registry(plugin_manager(local_modules=[module]))


def test_a_class_without_a_config_is_built_without_one(local_plugin):
    module = local_plugin(
        "configless_hook",
        """
        import grpo_kit

        class CountSteps:
            @grpo_kit.hookimpl
            def on_step_end(self, run, step, metrics):
                pass

        @grpo_kit.hookimpl
        def register_hooks(register):
            register("count_steps", CountSteps)
    """,
    )
    built = Registry(plugin_manager(local_modules=[module])).build("hook", "count_steps", {})
    assert type(built).__name__ == "CountSteps"
