"""The hook suite (grpo_kit/contract/hookspecs.py, `+hook=NAME`)."""

from grpo_kit.plugins.registry import plugin_manager
from grpo_kit.testing.contracts.plugin import PluginContract


class HookContract(PluginContract):
    """A hook plugin (hookspecs.py, `+hook=NAME`): its `on_*` methods are hooks the run calls."""

    kind = "hook"

    def test_joins_a_run_as_a_valid_pluggy_plugin(self, plugin):
        pm = plugin_manager(autoload=False, local_modules=[], disabled=[])
        pm.register(plugin)  # checks each hook's arguments against its spec
        pm.check_pending()  # fails on a misspelt hook name
        assert pm.get_hookcallers(plugin), "it implements no hook, so a run would never call it"

    def test_every_on_method_is_marked(self, plugin):
        pm = plugin_manager(autoload=False, local_modules=[], disabled=[])
        methods = [name for name in dir(plugin) if name.startswith("on_") and callable(getattr(plugin, name))]
        unmarked = [name for name in methods if pm.parse_hookimpl_opts(plugin, name) is None]
        assert not unmarked, f"{unmarked}: not marked @grpo_kit.hookimpl, so the run never calls them"
