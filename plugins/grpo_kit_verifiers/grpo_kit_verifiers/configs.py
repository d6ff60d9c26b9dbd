"""The verifiers plugins' options (kept apart from their code, so that composing a run imports none of verifiers)."""

from dataclasses import dataclass

from omegaconf import II

from grpo_kit.contract.kinds import RewardConfig


@dataclass
class VerifiersRolloutConfig:
    # verifiers' harness the agent runs in, by id: bash, codex, ...; None (rollout.harness=null) its chat loop
    # `null` (tools over MCP); "": the taskset's own choice (the bash harness unless the taskset ships one)
    harness: str | None = None
    runtime: str = "subprocess"  # where the harness program runs: subprocess (this machine), docker, prime, ...
    model: str = "policy"  # the model name the harness sends; the endpoint answers with the policy whatever it is
    # tokens per episode, every turn's and every tool result's together; the rest is cut off, as a truncation
    max_completion_length: int = II("generation.max_completion_length")
    batch_wait: float = 0.05  # seconds to wait for the other episodes' requests before generating a smaller batch


@dataclass
class VerifiersRewardConfig(RewardConfig):
    # None: the rubric's weighted total (verifiers' Trace.reward); a reward function's name: its score alone,
    # unweighted (reward.verifiers.weight weighs it in grpo_kit's sum)
    function: str | None = None
