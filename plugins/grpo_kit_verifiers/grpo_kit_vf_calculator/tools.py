"""The calculator's MCP server: verifiers starts it as `python -m grpo_kit_vf_calculator.tools`, one for the
taskset's episodes together."""

import verifiers.v1 as vf


class CalculatorTools(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = None  # the model calls `add`, not `calculator_tools_add`

    @vf.tool
    async def add(self, a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first number.
            b: The second number.
        """
        return a + b


if __name__ == "__main__":
    CalculatorTools.run()
