"""grpo-kit-vf-calculator: grpo_kit's embedded tool-use task (2-digit sums as chat) as a verifiers taskset whose
`add` tool is an MCP server, for multi-turn episodes with tool output in them.

The embedded tool-use model (grpo_kit/embedded/tool_use.py) calls `add` about three times in ten and guesses
otherwise; its chat template writes a call as `<call>add a=12 b=45</call>` and the result as
`<result>57</result>`. The tool is served bare (no `<server>_` prefix), as the model knows it. Two reward functions:
`correct` (weight 1), the reply is the sum, and `used_tool` (weight 0, a metric the total ignores), the episode
called a tool.
"""

import verifiers.v1 as vf

from grpo_kit.testing.tasks import embedded_problems
from grpo_kit_vf_calculator.tools import CalculatorTools


class SumData(vf.TaskData):
    answer: str


class CalculatorTask(vf.Task[SumData]):
    @vf.reward(weight=1.0)
    async def correct(self, task: SumData, trace: vf.Trace) -> float:
        return float(trace.last_reply == task.answer)

    @vf.reward(weight=0.0)
    async def used_tool(self, trace: vf.Trace) -> float:
        return float(bool(trace.tool_messages))


class Calculator(vf.Taskset[CalculatorTask, vf.TasksetConfig]):
    def load(self):
        for row in embedded_problems("tool_use"):
            yield CalculatorTask(SumData(prompt=row["prompt"], answer=row["solution"]), self.config.task)

    @classmethod
    def toolsets(cls, config: vf.TasksetConfig) -> list[vf.Toolset]:
        return [CalculatorTools(vf.ToolsetConfig())]


__all__ = ["Calculator"]
