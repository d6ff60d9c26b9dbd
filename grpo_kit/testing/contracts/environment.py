"""The environment suite (grpo_kit/contract/kinds.py: Environment, `+environment=NAME`)."""

from collections.abc import Sequence
from typing import ClassVar

import pytest

from grpo_kit.testing.contracts.plugin import PluginContract


class EnvironmentContract(PluginContract):
    """An environment (kinds.py: Environment, `+environment=NAME`): reset per generation, tools that describe
    themselves to the chat template and run in the tool loop.

    `rows` are dataset rows to reset with (by default the embedded tool-use task's); `tool_calls` are calls its
    tools should answer without failing, as (name, arguments) pairs; an environment with state lists calls that
    change it, so that the kit checks that `reset` starts afresh.
    """

    kind = "environment"
    rows: ClassVar[Sequence[dict]] = ()
    tool_calls: ClassVar[Sequence[tuple[str, dict]]] = ()

    @classmethod
    def contract_rows(cls) -> list[dict]:
        from grpo_kit.embedded.tool_use import build_task

        return list(cls.rows) or build_task(3)

    def test_reset_takes_a_row_and_returns_an_observation_or_none(self, plugin):
        for row in self.contract_rows():
            observation = plugin.reset(**row)
            assert observation is None or isinstance(observation, str), (
                f"reset(**row) returned {observation!r}: return a string (appended to the prompt) or None"
            )

    def test_every_tool_describes_itself_to_the_chat_template(self, plugin, contract_case):
        from grpo_kit.rollout.tool_use import check_tool, environment_tools

        tools = environment_tools(plugin)
        assert tools, "it has no public method besides reset, so the model has no tool to call"
        for tool in tools:
            check_tool(tool, str(contract_case))

    def test_tools_answer_in_the_tool_loop(self, plugin):
        from grpo_kit.rollout.tool_use import environment_tools, run_tool_calls, toolbox

        if not self.tool_calls:
            pytest.skip("tool_calls = [(name, arguments), ...] names calls its tools should answer")
        plugin.reset(**self.contract_rows()[0])
        [(messages, failed)] = run_tool_calls([(self._calls(), toolbox(environment_tools(plugin)))], timeout=30.0)
        assert failed == 0, f"tool calls failed: {[m['content'] for m in messages]}"

    def test_reset_starts_afresh(self, plugin):
        """The same calls after `reset(**row)` get the same answers, whatever came before."""
        from grpo_kit.rollout.tool_use import environment_tools, run_tool_calls, toolbox

        if not self.tool_calls:
            pytest.skip("tool_calls = [(name, arguments), ...] names calls its tools should answer")
        answers = []
        for _ in range(2):
            plugin.reset(**self.contract_rows()[0])
            [(messages, _)] = run_tool_calls([(self._calls(), toolbox(environment_tools(plugin)))], timeout=30.0)
            answers.append([message["content"] for message in messages])
        assert answers[0] == answers[1], f"answers after reset differ: {answers[0]} then {answers[1]}"

    def _calls(self) -> list[dict]:
        return [
            {"type": "function", "function": {"name": name, "arguments": dict(arguments)}}
            for name, arguments in self.tool_calls
        ]
