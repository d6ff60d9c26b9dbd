"""Multi-turn rollouts: generate, call the tools the completion asks for, append their results, generate again.

A round generates for every completion that is still going; each turn is read back into a chat message by the
tokenizer's own response template (`tokenizer.parse_response`, transformers 5); a turn that ended with EOS and
holds tool calls gets them run (concurrently across completions, each with a timeout), and the chat template
writes their results after it. A completion stops at a turn without tool calls, after
`algorithm.max_tool_calling_iterations` rounds of calls, or at `generation.max_completion_length` tokens in all.

What the model wrote and what the tools wrote end up in one completion, the tools' tokens marked 0 in
`tool_mask`: the model reads them, the loss and its token counts do not (grpo_kit/objective/objective.py:
loss_mask). The sampler's log-probs of tool tokens are 0, and masked too. Everything goes through the generation
backend's `generate` with token ids, so every backend runs multi-turn rollouts.

As TRL's GRPOTrainer (`tools`, `environment_factory`, `max_tool_calling_iterations`), with two choices of ours:
a turn cut off by the length limit has its (unfinished) tool calls ignored, and each tool call has a timeout.
"""

import asyncio
import copy
import importlib
import inspect
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from grpo_kit.contract.eos import is_truncated
from grpo_kit.contract.errors import ConfigError, PluginError
from grpo_kit.contract.kinds import Completions
from grpo_kit.rollout.prompts import is_conversational


@dataclass
class Turns:
    """A generation batch of multi-turn completions."""

    prompt_ids: list[list[int]]  # (N,) the rendered prompts, with each environment's observation
    completions: list[list[dict]]  # (N,) the assistant and tool messages after the prompt
    generated: Completions  # (N, T), with tool_mask, tool_calls and tool_failures


class ToolUse:
    """Runs the tool-calling loop for a run; `tools` are plain functions, `environment` builds one environment per
    completion (None without one)."""

    def __init__(
        self,
        tokenizer,
        generation,
        accelerator,
        tools: list[Callable],
        environment: Callable | None,
        max_completion_length: int,
        max_iterations: int | None,
        timeout: float,
        eos_token_ids: list[int],
    ):
        self.tokenizer, self.generation, self.accelerator = tokenizer, generation, accelerator
        self.eos_token_ids = eos_token_ids  # a turn ends at any of them (grpo_kit.contract.eos), as the backend stops
        self.tools, self.environment = tools, environment
        self.max_completion_length, self.timeout = max_completion_length, timeout
        self.max_iterations = float("inf") if max_iterations is None else max_iterations
        self.environments: list[Any] = []  # one per completion of a batch, built on first need and reset per batch
        check_tokenizer(tokenizer)

    def __call__(self, rows: list[dict], with_logprobs: bool) -> Turns:
        toolboxes, prompts = self._reset(rows)
        prompt_ids = [
            render(self.tokenizer, prompt, box, generation_prompt=True) for prompt, box in zip(prompts, toolboxes)
        ]
        n = len(rows)
        ids, tool_mask, logps = [[] for _ in range(n)], [[] for _ in range(n)], [[] for _ in range(n)]
        messages: list[list[dict]] = [[] for _ in range(n)]
        calls, failures = [0] * n, [0] * n
        active, rounds = list(range(n)), 0
        while self._anyone(active):
            generated = self._generate([prompt_ids[i] + ids[i] for i in active] or prompt_ids[:1], with_logprobs)
            asking = []
            for row, (turn, turn_logps) in zip(active, generated):
                turn = turn[: self.max_completion_length - len(ids[row])]  # the rest of the completion's budget
                ended = bool(turn) and turn[-1] in self.eos_token_ids
                message = parse_turn(self.tokenizer, turn, prompt_ids[row] + ids[row], toolboxes[row])
                ids[row] += turn
                tool_mask[row] += [1] * len(turn)
                logps[row] += turn_logps[: len(turn)]
                messages[row].append(message)
                if message.get("tool_calls") and ended and rounds < self.max_iterations:
                    asking.append(row)
            results = run_tool_calls(
                [(messages[row][-1]["tool_calls"], toolboxes[row]) for row in asking], self.timeout
            )
            active = []
            for row, (tool_messages, failed) in zip(asking, results):
                calls[row] += len(tool_messages)
                failures[row] += failed
                suffix = tool_result_ids(self.tokenizer, prompts[row] + messages[row], tool_messages, toolboxes[row])
                if len(ids[row]) + len(suffix) >= self.max_completion_length:
                    continue  # no room left to answer: the completion ends with its tool call, as in TRL
                messages[row] += tool_messages
                ids[row] += suffix
                tool_mask[row] += [0] * len(suffix)
                logps[row] += [0.0] * len(suffix)
                active.append(row)
            rounds += 1
        return Turns(
            prompt_ids, messages, self._completions(ids, tool_mask, logps if with_logprobs else None, calls, failures)
        )

    def _reset(self, rows: list[dict]) -> tuple[list[dict[str, Callable]], list[list[dict]]]:
        """Each completion's tools, and its prompt with the observation its environment's reset returned."""
        prompts = []
        for row in rows:
            if not is_conversational(row["prompt"]):
                raise ConfigError(
                    f"Tools need chat-message prompts, and this dataset's prompt is text "
                    f"({str(row['prompt'])[:60]!r}): "
                    "give `prompt` as a list of {role, content} messages."
                )
            prompts.append(copy.deepcopy(row["prompt"]))
        if self.environment is None:
            return [toolbox(self.tools)] * len(rows), prompts
        while len(self.environments) < len(rows):
            self.environments.append(self.environment())
        toolboxes = []
        for environment, row, prompt in zip(self.environments, rows, prompts):
            observation = environment.reset(**row)
            if observation is not None:
                prompt[-1]["content"] += str(observation)
            toolboxes.append(toolbox(self.tools + environment_tools(environment)))
        return toolboxes, prompts

    def _anyone(self, active: list[int]) -> bool:
        """Whether any process has completions going: every process joins every round, because a backend's
        `generate` may be collective (a server client's gather, sharded weights)."""
        if self.accelerator.num_processes == 1:
            return bool(active)
        count = torch.tensor([len(active)], device=self.accelerator.device)
        return bool(self.accelerator.gather(count).sum() > 0)

    def _generate(self, prompt_ids: list[list[int]], with_logprobs: bool) -> list[tuple[list[int], list[float]]]:
        """For each prompt: the turn's tokens, up to and including EOS, and their log-probs."""
        out = self.generation.generate(prompt_ids, with_logprobs=with_logprobs)
        lengths = out.completion_mask.sum(dim=1).tolist()
        ids = out.completion_ids.tolist()
        logps = out.sampling_per_token_logps.tolist() if out.sampling_per_token_logps is not None else None
        return [(ids[i][:length], logps[i][:length] if logps else [0.0] * length) for i, length in enumerate(lengths)]

    def _completions(self, ids, tool_mask, logps, calls, failures) -> Completions:
        width = max(1, max(len(row) for row in ids))

        def padded(rows, value, dtype):  # (N, width)
            return torch.tensor([row + [value] * (width - len(row)) for row in rows], dtype=dtype)

        completion_ids = padded(ids, self.tokenizer.pad_token_id, torch.long)
        completion_mask = padded([[1] * len(row) for row in ids], 0, torch.int)
        return Completions(
            completion_ids=completion_ids,
            completion_mask=completion_mask,
            is_truncated=is_truncated(completion_ids, completion_mask, self.eos_token_ids, self.tokenizer.pad_token_id),
            sampling_per_token_logps=None if logps is None else padded(logps, 0.0, torch.float),
            tool_mask=padded(tool_mask, 0, torch.int),
            tool_calls=torch.tensor(calls),
            tool_failures=torch.tensor(failures),
        )


def toolbox(functions: list[Callable]) -> dict[str, Callable]:
    return {function.__name__: function for function in functions}


def environment_tools(environment) -> list[Callable]:
    """An environment's tools: its public methods but `reset` and `get_reward` (its score, for +reward=environment)."""
    return [
        getattr(environment, name)
        for name, member in inspect.getmembers(type(environment), callable)
        if not name.startswith("_") and name not in ("reset", "get_reward")
    ]


def render(tokenizer, messages: list[dict], tools: dict[str, Callable], generation_prompt: bool) -> list[int]:
    return tokenizer.apply_chat_template(
        messages,
        tools=list(tools.values()) or None,
        add_generation_prompt=generation_prompt,
        tokenize=True,
        return_dict=False,
    )


def parse_turn(tokenizer, turn: list[int], prefix: list[int], tools: dict[str, Callable]) -> dict:
    """The turn as an assistant message, with `tool_calls` when it makes any. A turn the response template cannot
    read (a malformed call) is plain content: the model sees no result, and learns from the reward."""
    try:
        message = tokenizer.parse_response(turn, prefix=prefix, tools=list(tools.values()))
    except ValueError:
        message = {"role": "assistant", "content": tokenizer.decode(turn, skip_special_tokens=True)}
    return {"content": ""} | message  # rewards read every message's content, which a bare tool call lacks


def tool_result_ids(tokenizer, conversation: list[dict], tool_messages: list[dict], tools) -> list[int]:
    """The tokens the chat template writes after the assistant's tool-call turn: the results, and the opening of
    the next assistant turn.

    The conversation is rendered without and with the results. The turn the model wrote ends at its EOS, where
    some templates add a newline before the next message: the shorter rendering is cut at its last EOS, so that
    what follows is exactly what comes after the model's last token.
    """
    before = render(tokenizer, conversation, tools, generation_prompt=False)
    after = render(tokenizer, conversation + tool_messages, tools, generation_prompt=True)
    eos = [index for index, token in enumerate(before) if token == tokenizer.eos_token_id]
    if eos:
        before = before[: eos[-1] + 1]
    if after[: len(before)] != before:
        raise ConfigError(
            "The chat template writes the conversation before a tool result differently once the result is added, "
            "so the result's tokens cannot be appended to what the model wrote. Use a chat template that only "
            "appends when a message is added (most tool-calling templates do)."
        )
    return after[len(before) :]


def run_tool_calls(
    requests: list[tuple[list[dict], dict[str, Callable]]], timeout: float
) -> list[tuple[list[dict], int]]:
    """For each completion's (tool calls, tools): the tool messages, and how many calls failed. Completions run
    concurrently, the calls of one completion one after another (they may share an environment's state)."""

    async def one_completion(calls, tools):
        messages, failed = [], 0
        for call in calls:
            function = call.get("function", {})
            name = function.get("name", "?")
            try:
                content = str(await call_tool(tools, name, function.get("arguments") or {}, timeout))
            except Exception as error:  # the model sees what went wrong, and the run goes on
                content, failed = f"Error: {describe(error, timeout)}", failed + 1
            messages.append({"role": "tool", "name": name, "content": content})
        return messages, failed

    async def every_completion():
        return await asyncio.gather(*(one_completion(calls, tools) for calls, tools in requests))

    return asyncio.run(every_completion()) if requests else []


async def call_tool(tools: dict[str, Callable], name: str, arguments: dict, timeout: float):
    if name not in tools:
        raise LookupError(f"there is no tool named {name!r} (tools: {', '.join(tools) or 'none'})")
    function = tools[name]
    if inspect.iscoroutinefunction(function):
        return await asyncio.wait_for(function(**arguments), timeout)
    return await asyncio.wait_for(in_daemon_thread(function, arguments), timeout)


def in_daemon_thread(function: Callable, arguments: dict) -> asyncio.Future:
    """`function(**arguments)` in a thread of its own. A daemon thread, not an executor's: a tool that never
    returns is abandoned at its timeout, and must not keep the run from exiting."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(result, error):
        if not future.done():
            future.set_exception(error) if error is not None else future.set_result(result)

    def target():
        try:
            outcome = (function(**arguments), None)
        except Exception as error:
            outcome = (None, error)
        try:
            loop.call_soon_threadsafe(settle, *outcome)
        except RuntimeError:  # the round ended without this call (it timed out): nobody is waiting
            pass

    threading.Thread(target=target, daemon=True).start()
    return future


def describe(error: Exception, timeout: float) -> str:
    if isinstance(error, asyncio.TimeoutError):  # wait_for's; the builtin TimeoutError only from Python 3.11
        return f"the tool did not answer within {timeout:g} s"
    return f"{type(error).__name__}: {error}"


def check_tokenizer(tokenizer) -> None:
    """Tool use needs the tokenizer to read tool calls and the chat template to write tool results."""
    if getattr(tokenizer, "response_template", None) is None or not hasattr(tokenizer, "parse_response"):
        raise ConfigError(
            "Tool calls are read with the tokenizer's response template (transformers 5's "
            "`tokenizer.parse_response`), and this tokenizer has none. Use a model whose tokenizer ships a "
            "`response_template`, or add one to its tokenizer_config.json (transformers' chat-parsing docs)."
        )
    if getattr(tokenizer, "chat_template", None) is None:
        raise ConfigError("Tool use needs a chat template that writes tool calls and results; this tokenizer has none.")


def tool_functions(paths: list[str]) -> list[Callable]:
    """The functions `tools=[pkg.mod:fn, ...]` names, each checked to describe itself to the chat template."""
    functions = []
    for path in paths:
        module_name, _, attribute = path.partition(":")
        try:
            function = getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError, ValueError) as error:
            raise ConfigError(
                f"tools={path}: could not import it ({error}). Write tools=[package.module:function]."
            ) from None
        check_tool(function, f"tools={path}")
        functions.append(function)
    return functions


def check_tool(function: Callable, where: str) -> None:
    """A tool describes itself with type hints and a Google-style docstring, which transformers turns into the
    JSON schema the chat template shows the model."""
    from transformers.utils import get_json_schema

    try:
        get_json_schema(function)
    except Exception as error:
        raise PluginError(
            f"{where}: the tool {getattr(function, '__name__', function)!r} cannot describe itself to the model: "
            f"{error}. Give every argument a type hint, and a Google-style docstring with an `Args:` line for each."
        ) from None
