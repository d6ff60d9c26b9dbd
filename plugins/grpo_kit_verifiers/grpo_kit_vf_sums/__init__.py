"""grpo-kit-vf-sums: grpo_kit's embedded task ("a+b=", one-digit operands) as a verifiers taskset, single-turn.

A verifiers taskset that needs no download, for the embedded model (grpo_kit/embedded/sums.py), which has no chat
template: the verifiers rollout hands it the user's message as plain text, and its reply is the answer. One reward
function, `correct`: 1 when the reply is the sum. `python -m grpo_kit_verifiers.tasks grpo-kit-vf-sums tasks.jsonl`
writes its prompts; docs/plugins/verifiers.md trains on them.

It ships its own harness, as a verifiers taskset may (its package exports a `Harness`): one chat request, made
from the environment's own process. verifiers' built-in chat harness (`null`) starts a Python program per episode,
about a second of CPU each on two cores, and the embedded model learns from thousands of episodes; with this one an
episode costs milliseconds, and the rest of verifiers' machinery (interception server, trace, scoring) is the same.
`rollout.harness=null` plays the same tasks in the built-in one.
"""

import ssl

import httpx
import verifiers.v1 as vf
from openai import AsyncOpenAI
from verifiers.v1.runtimes import ProgramResult

from grpo_kit.testing.tasks import embedded_problems


class SumData(vf.TaskData):
    answer: str


class SumTask(vf.Task[SumData]):
    @vf.reward(weight=1.0)
    async def correct(self, task: SumData, trace: vf.Trace) -> float:
        return float(trace.last_reply == task.answer)


class Sums(vf.Taskset[SumTask, vf.TasksetConfig]):
    def load(self):
        for row in embedded_problems("sums"):
            yield SumTask(SumData(prompt=row["prompt"], answer=row["solution"]), self.config.task)


# A client's default TLS context reads the system's certificates, 25 ms each time: one context for every episode.
TLS = ssl.create_default_context()


class OneRequestConfig(vf.HarnessConfig):
    pass


class OneRequest(vf.Harness[OneRequestConfig]):
    """The task's prompt in one chat request to the model under training; its reply ends the episode."""

    APPENDS_SYSTEM_PROMPT = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, tool_interception_url=None):
        system, prompt = self.resolve_prompt(data)
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": prompt})
        http = httpx.AsyncClient(verify=TLS, timeout=None)
        async with AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0, http_client=http) as client:
            response = await client.chat.completions.create(model=ctx.model, messages=messages)
        return ProgramResult(exit_code=0, stdout=response.choices[0].message.content or "", stderr="")


__all__ = ["OneRequest", "Sums"]
