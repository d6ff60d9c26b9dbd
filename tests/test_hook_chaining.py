"""What grpo_kit.plugins.chaining relies on of pluggy, pinned: should a pluggy release change it, this fails first."""

import pluggy

from grpo_kit.plugins.chaining import chain

hookspec = pluggy.HookspecMarker("chaining-test")
hookimpl = pluggy.HookimplMarker("chaining-test")


class Spec:
    @hookspec
    def refine(self, value, step):
        """Return a new value, or None to keep it."""


def appender(name: str, **marks):
    class Plugin:
        @hookimpl(**marks)
        def refine(self, value):  # takes only some of the hook's arguments, as an implementation may
            return value + [name]

    Plugin.__name__ = name
    return Plugin()


def manager(*plugins) -> pluggy.PluginManager:
    plugin_manager = pluggy.PluginManager("chaining-test")
    plugin_manager.add_hookspecs(Spec)
    for plugin in plugins:
        plugin_manager.register(plugin)
    return plugin_manager


def test_get_hookimpls_gives_public_hookimpls_with_what_chain_reads():
    impls = manager(appender("a"), appender("b", tryfirst=True)).hook.refine.get_hookimpls()
    assert all(isinstance(impl, pluggy.HookImpl) for impl in impls) and "HookImpl" in pluggy.__all__
    assert sorted(impl.argnames for impl in impls) == [("value",), ("value",)]
    assert {(impl.plugin.__class__.__name__, impl.tryfirst, impl.trylast) for impl in impls} == {
        ("a", False, False),
        ("b", True, False),
    }


def test_chain_runs_in_registration_order_with_tryfirst_first_and_trylast_last():
    plugins = manager(appender("a"), appender("last", trylast=True), appender("b"), appender("first", tryfirst=True))
    assert chain(plugins.hook.refine, "value", lambda *_: None, value=[], step=1) == ["first", "a", "b", "last"]


def test_chain_keeps_the_value_an_implementation_returns_none_for_and_checks_the_others():
    class Keeper:
        @hookimpl
        def refine(self, value, step):
            return None

    checked = []
    plugins = manager(Keeper(), appender("a"))
    result = chain(plugins.hook.refine, "value", lambda *seen: checked.append(seen), value=["x"], step=1)
    assert result == ["x", "a"] and checked == [(["x", "a"], ["x"], "The refine hook of a")]
