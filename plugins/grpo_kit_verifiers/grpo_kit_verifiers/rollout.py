"""verifiers: each prompt row's task played as a verifiers episode, its tokens and its rubric's scores the rollout.

verifiers' own machinery runs every episode unchanged (`Env.run_episode`: the taskset's task, the harness program
in its runtime, verifiers' interception server, the tools' MCP servers, then the task's `@vf.reward` functions);
the model it calls is grpo_kit's generation backend behind an OpenAI-compatible endpoint (bridge.py), which keeps
each episode's tokens and marks what the model did not write. The scores reach the rewards as columns:
`verifiers_reward` (the trace's weighted total, `Trace.reward`) and `verifiers_scores` (each function's score).
"""

import asyncio
import contextlib
import logging
import os
import sysconfig

from grpo_kit.contract.errors import PluginError
from grpo_kit.contract.kinds import RolloutResult
from grpo_kit_verifiers.bridge import Bridge
from grpo_kit_verifiers.configs import VerifiersRolloutConfig
from grpo_kit_verifiers.tasks import TASK_COLUMN, TASKSET_COLUMN, task_of


class VerifiersRollout:
    def __init__(self, config: VerifiersRolloutConfig):
        self.config = config
        # verifiers reports every episode, its clients (httpx) and its interception server (aiohttp) every request,
        # at INFO: thousands of lines in a run's log
        for name in ("verifiers", "httpx", "aiohttp.access"):
            logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLogger(name).level))
        self.environments = {}  # taskset id -> its verifiers Env, built at first use
        # verifiers' runtimes prepare harness programs with the `uv` they find on PATH (else they download one). The
        # uv this distribution depends on is in the interpreter's scripts folder, on PATH only in an activated
        # environment: it goes last, so that a uv of the user's own comes first.
        path = os.environ.get("PATH", "")
        if sysconfig.get_path("scripts") not in path.split(os.pathsep):
            os.environ["PATH"] = os.pathsep.join(filter(None, [path, sysconfig.get_path("scripts")]))

    def __call__(self, rows: list[dict], tokenizer, generation) -> RolloutResult:
        missing = [column for column in (TASKSET_COLUMN, TASK_COLUMN) if column not in rows[0]]
        if missing:
            raise PluginError(
                f"+rollout=verifiers plays verifiers tasks, and the prompt rows lack {', '.join(missing)}: write "
                "them with `python -m grpo_kit_verifiers.tasks TASKSET_ID tasks.jsonl` and train with "
                "data.path=tasks.jsonl."
            )
        traces, sessions = asyncio.run(self._episodes(rows, tokenizer, generation))
        return RolloutResult(
            prompt_ids=[session.prompt_ids for session in sessions],
            completion_ids=[session.completion_ids for session in sessions],
            # the sampler's log-probs, where the backend gave them for every turn (0 on what the model did not write)
            logprobs=[s.logprobs for s in sessions] if all(s.sampled_logprobs for s in sessions) else None,
            env_mask=[session.env_mask for session in sessions],
            # chat prompts: the episode's messages (text prompts: the decoded tokens, the completion as text)
            completions=[conversation(t, row["prompt"]) for t, row in zip(traces, rows)] if chat(rows) else None,
            columns={
                "verifiers_reward": [trace.reward for trace in traces],
                "verifiers_scores": [scores(trace) for trace in traces],
                "verifiers_turns": [session.turns for session in sessions],
            },
        )

    async def _episodes(self, rows: list[dict], tokenizer, generation) -> tuple[list, list]:
        import verifiers.v1 as vf

        environments = [self.environment(row[TASKSET_COLUMN]) for row in rows]
        bridge = Bridge(tokenizer, generation, self.config.max_completion_length, self.config.batch_wait)
        async with bridge, contextlib.AsyncExitStack() as stack:
            for environment in set(environments):  # interception, shared tool servers: one set per taskset
                await stack.enter_async_context(environment.serving())
            context = vf.ModelContext(
                model=self.config.model, client=vf.EvalClientConfig(base_url=bridge.base_url, api_key_var="")
            )
            bridge.started(len(rows))

            async def episode(environment, row):
                try:
                    return await environment.run_episode(task_of(environment.taskset, row), context)
                finally:
                    bridge.finished()

            episodes = await asyncio.gather(*(episode(env, row) for env, row in zip(environments, rows)))
        if bridge.failure is not None:
            raise bridge.failure
        traces = [played(episode, bridge) for episode in episodes]
        return traces, [bridge.sessions[trace.id].cut(self.config.max_completion_length) for trace in traces]

    def environment(self, taskset_id: str):
        """The taskset's verifiers Env, its agent running in the configured harness and runtime."""
        if taskset_id not in self.environments:
            import verifiers.v1 as vf

            agent = {"runtime": {"type": self.config.runtime}}
            harness = "null" if self.config.harness is None else self.config.harness  # Hydra reads `null` as None
            if harness:
                agent["harness"] = {"id": harness}
            config = vf.resolve_env_config({"taskset": {"id": taskset_id}, "agent": agent})
            self.environments[taskset_id] = vf.load_environment(config)
        return self.environments[taskset_id]


def played(episode, bridge: Bridge):
    """The episode's one trace that talked to the model; an episode that never reached it fails the rollout."""
    traces = [trace for trace in episode.traces if trace.id in bridge.sessions]
    if len(traces) == 1:
        return traces[0]
    errors = [error.message for error in episode.errors] + [
        error.message for trace in episode.traces for error in trace.errors
    ]
    if not traces:
        raise PluginError(f"a verifiers episode ended before it called the model: {'; '.join(errors) or 'no error'}")
    raise PluginError(
        f"a verifiers episode called the model from {len(traces)} agent runs; +rollout=verifiers trains "
        "single-agent episodes, whose one trace is the completion."
    )


def chat(rows: list[dict]) -> bool:
    return any(not isinstance(row["prompt"], str) for row in rows)


def conversation(trace, prompt) -> list[dict]:
    """The episode after its prompt, as OpenAI chat messages: the model's turns, and the tool results and replies
    the harness added; what the rewards read, and the samples show."""
    from verifiers.v1.dialects.chat import message_to_wire

    opening = 1 if isinstance(prompt, str) else len(prompt)
    return [{**wire, "content": wire.get("content") or ""} for wire in map(message_to_wire, trace.messages[opening:])]


def scores(trace) -> dict[str, float | None]:
    """Each reward function's score, unweighted; None where it did not score (it failed, or scoring was skipped)."""
    return {name: None if reward is None else reward.score for name, reward in trace.rewards.items()}
