"""Hooks whose implementations each refine what the one before returned: a filter after a filter.

pluggy's own calls stop at the first result (`firstresult`) or collect every result from the same arguments; neither
hands one implementation's result to the next. So a chained hook walks its implementations itself, through pluggy's
public `HookCaller.get_hookimpls()` and `pluggy.HookImpl` (tests/test_hook_chaining.py pins what this relies on).
"""


def chain(hook, key: str, check, **arguments):
    """Hand `arguments[key]` through every implementation of `hook`, each given what the one before returned
    (None: unchanged), so that two filters both apply. `check(result, before, who)` refuses a result that breaks
    the hook's contract.

    The order is the registration order (always-on modules, then `+hook=[a,b]`: a, then b), with
    `hookimpl(tryfirst=True)` first and `trylast=True` last.
    """
    implementations = sorted(hook.get_hookimpls(), key=lambda impl: (not impl.tryfirst) + impl.trylast)
    for impl in implementations:
        result = impl.function(*(arguments[name] for name in impl.argnames))
        if result is not None:
            check(result, arguments[key], f"The {hook.name} hook of {plugin_name(impl)}")
            arguments[key] = result
    return arguments[key]


def plugin_name(impl) -> str:
    """A module's name, or the class of a hook plugin selected with +hook=NAME."""
    return getattr(impl.plugin, "__name__", type(impl.plugin).__name__)
