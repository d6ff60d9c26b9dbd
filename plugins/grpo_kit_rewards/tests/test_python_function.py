import asyncio
import json

import pytest

import grpo_kit
from grpo_kit.rollout.scoring import Scorer
from grpo_kit.testing import tiny_run
from grpo_kit_rewards.configs import PythonFunctionConfig
from grpo_kit_rewards.python_function import PythonFunction

USER_REWARDS = """
    import asyncio

    def brevity(prompts, completions, completion_ids, target=2, **columns):
        return [-abs(len(c) - target) for c in completions]

    async def remote_judge(prompts, completions, completion_ids, **columns):
        await asyncio.sleep(0)
        return [0.5] * len(completions)

    def make_constant(value):
        def constant(completions, **kwargs):
            return [value] * len(completions)
        return constant

    def heavy(completions, **kwargs):
        return [0.0] * len(completions)
    heavy.cpu_heavy = True
"""


@pytest.fixture
def user_module(local_plugin):
    return local_plugin("user_rewards", USER_REWARDS)


def python_reward(**options) -> PythonFunction:
    return PythonFunction(PythonFunctionConfig(**options))


@pytest.mark.parametrize("separator", [":", "."])
def test_function_by_import_path_gets_its_kwargs(user_module, separator):
    reward = python_reward(function=f"{user_module}{separator}brevity", kwargs={"target": 3})
    assert reward(["q", "q"], ["abc", "a"], [[0], [0]]) == [0, -2]
    assert not reward.cpu_heavy and not reward.is_coroutine


def test_factory_is_called_once_with_its_kwargs(user_module):
    reward = python_reward(function=f"{user_module}:make_constant", factory_kwargs={"value": 0.25})
    assert reward(["q"], ["a"], [[0]]) == [0.25]


def test_async_function_is_awaited_by_the_scorer(user_module):
    reward = python_reward(function=f"{user_module}:remote_judge")
    assert reward.is_coroutine
    with Scorer({"python": reward}) as scorer:
        rewards, _ = scorer(["q"], ["a"], [[0]], {})
    assert rewards.tolist() == [[0.5]]


def test_cpu_heavy_as_declared_or_as_configured(user_module):
    assert python_reward(function=f"{user_module}:heavy").cpu_heavy
    assert not python_reward(function=f"{user_module}:heavy", cpu_heavy=False).cpu_heavy
    assert python_reward(function=f"{user_module}:brevity", cpu_heavy=True).cpu_heavy


@pytest.mark.parametrize(
    ("function", "message"),
    [
        (None, "A python reward.s function is not set"),
        ("brevity", "is not an import path: write it as package.module:function"),
        ("not_a_module_xyz:f", "module 'not_a_module_xyz' cannot be imported"),
        ("user_rewards:missing", "module 'user_rewards' has no attribute 'missing'"),
        ("asyncio:__name__", "names a str, not a function"),
    ],
)
def test_bad_paths_are_named(user_module, function, message):
    with pytest.raises(ValueError, match=message):
        python_reward(function=function)


def test_async_target_called_directly_returns_a_coroutine(user_module):
    reward = python_reward(function=f"{user_module}:remote_judge")
    assert asyncio.run(reward(["q"], ["a"], [[0]])) == [0.5]


def test_two_functions_in_one_run_each_with_its_weight_and_kwargs(user_module, tiny_model, registry, tmp_path):
    overrides = tiny_run(
        tiny_model,
        "+reward@reward.brevity=python",
        f"reward.brevity.function={user_module}:brevity",
        "reward.brevity.weight=0.5",
        "reward.brevity.kwargs={target:1}",
        "+reward@reward.constant=python",
        f"reward.constant.function={user_module}:make_constant",
        "reward.constant.factory_kwargs={value:0.25}",
    )
    grpo_kit.train(grpo_kit.compose(overrides, registry), tmp_path, registry)
    steps = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [metrics for metrics in steps if "reward" in metrics]  # not the lines of evaluations only
    assert len(steps) == 3
    for metrics in steps:
        assert metrics["rewards/brevity/mean"] <= 0 and metrics["rewards/constant/mean"] == 0.25
        assert metrics["reward"] == pytest.approx(0.5 * metrics["rewards/brevity/mean"] + 0.25, abs=1e-5)
