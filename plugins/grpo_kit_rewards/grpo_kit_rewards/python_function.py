"""python: any reward function named by import path, `reward.python.function=package.module:function`.

Several functions are several python rewards, each under its own key, its metric name:
`+reward@reward.brevity=python reward.brevity.function=mylab.rewards:brevity`.

The function is called with TRL's reward arguments (https://huggingface.co/docs/trl/grpo_trainer, "Using a custom
reward function") plus the keyword arguments in `reward.python.kwargs`, so a TRL reward function such as
`trl.rewards:think_format_reward` works as it is. A path naming a factory, like TRL's
`trl.rewards:get_soft_overlong_punishment`, is called once with `factory_kwargs` to make the function. The function
may be `async def`; one that declares `cpu_heavy = True` (or `reward.python.cpu_heavy=true`) runs in the Scorer's
worker processes.
"""

import importlib
import inspect


class PythonFunction:
    def __init__(self, config):
        target = _imported(config.function)
        self.function = target if config.factory_kwargs is None else target(**config.factory_kwargs)
        self.kwargs = dict(config.kwargs or {})
        self.cpu_heavy = getattr(self.function, "cpu_heavy", False) if config.cpu_heavy is None else config.cpu_heavy
        # The Scorer reads `is_coroutine` to await what this sync wrapper returns for an async function.
        self.is_coroutine = inspect.iscoroutinefunction(self.function) or inspect.iscoroutinefunction(
            getattr(self.function, "__call__", None)
        )

    def __call__(self, prompts, completions, completion_ids, **columns):
        return self.function(
            prompts=prompts, completions=completions, completion_ids=completion_ids, **columns, **self.kwargs
        )


def _imported(path: str | None):
    if not path:
        raise ValueError(
            "A python reward's function is not set: name the reward function by import path, e.g. "
            "reward.python.function=mylab.rewards:brevity (reward.KEY.function=... for a python reward placed with "
            "+reward@reward.KEY=python)."
        )
    module_name, _, attribute = path.partition(":") if ":" in path else path.rpartition(".")
    if not module_name or not attribute:
        raise ValueError(
            f"The python reward's function={path} is not an import path: write it as package.module:function."
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(
            f"The python reward's function={path}: module {module_name!r} cannot be imported ({error}). Is it "
            "installed, or on PYTHONPATH?"
        ) from error
    if not hasattr(module, attribute):
        raise ValueError(f"The python reward's function={path}: module {module_name!r} has no attribute {attribute!r}.")
    target = getattr(module, attribute)
    if not callable(target):
        raise ValueError(f"The python reward's function={path} names a {type(target).__name__}, not a function.")
    return target
