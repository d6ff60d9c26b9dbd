"""The built-in rewards' options: each field is a `reward.NAME.FIELD=...` option, with its default.

The options live here, apart from the rewards, so that a worker process running a reward never imports the core.
`${generation.max_completion_length}` defaults resolve against the composed run's config.
"""

from dataclasses import dataclass, field
from typing import Any

from omegaconf import II

from grpo_kit import RewardConfig
from grpo_kit.contract.secrets import secret


@dataclass
class AccuracyConfig(RewardConfig):
    solution_column: str = "solution"  # the dataset column holding the gold answers


@dataclass
class ReasoningAccuracyConfig(AccuracyConfig):
    # The answer is what follows the first of these found in the completion.
    reasoning_delimiters: list[str] = field(default_factory=lambda: ["</think>"])


@dataclass
class CosineScaledConfig(AccuracyConfig):
    max_len: int = II("generation.max_completion_length")  # tokens at which the schedule reaches its far end
    min_value_wrong: float = -1.0  # a wrong answer at length 0
    max_value_wrong: float = -0.5  # a wrong answer at max_len
    min_value_correct: float = 0.5  # a right answer at max_len
    max_value_correct: float = 1.0  # a right answer at length 0


@dataclass
class RepetitionPenaltyConfig(RewardConfig):
    ngram_size: int = 3  # units per n-gram; a completion with fewer units scores 0.0
    max_penalty: float = -1.0  # the reward of a completion that is one n-gram repeated
    unit: str = "tokens"  # n-grams of "tokens" (TRL) or of lower-cased "words" (open-r1)


@dataclass
class SoftOverlongConfig(RewardConfig):
    max_completion_len: int = II("generation.max_completion_length")  # tokens past which the penalty is -1
    soft_punish_cache: int | None = None  # tokens before max_completion_len where the penalty ramps; required


@dataclass
class PythonFunctionConfig(RewardConfig):
    function: str | None = None  # "package.module:function"; required. Several: +reward@reward.KEY=python each
    # Dicts typed Any so that free keys can be given: reward.python.kwargs={target:3}
    kwargs: Any = None  # added to every call
    factory_kwargs: Any = None  # set: `function` is a factory, called once with these to make the reward
    cpu_heavy: bool | None = None  # run in worker processes; None: as the function declares (`cpu_heavy = True`)


@dataclass
class RewardModelConfig(RewardConfig):
    path: str | None = None  # a Hugging Face model id or local folder (AutoModelForSequenceClassification); required
    batch_size: int = 8  # texts scored per forward pass
    device: str = "auto"  # "auto": cuda when there is one, else cpu
    max_length: int | None = None  # tokens per text; None: no truncation
    dtype: str = "auto"  # the model's torch dtype (bfloat16, float32, ...); "auto": the checkpoint's
    # Run the reward model's own code from the hub: as model.trust_remote_code in a run, false outside one.
    trust_remote_code: bool = II("oc.select:model.trust_remote_code,false")


JUDGE_TEMPLATE = (
    "Rate how well the response answers the question, from 0 (wrong) to 10 (entirely right).\n\n"
    "Question:\n{prompt}\n\nResponse:\n{completion}\n\nEnd your answer with the score, a number from 0 to 10."
)


@dataclass
class JudgeConfig(RewardConfig):
    base_url: str | None = None  # the OpenAI-compatible server, e.g. http://localhost:8000 (/v1 is added); required
    model: str | None = None  # the name the server serves the judge under; required
    api: str = "chat"  # "chat": /v1/chat/completions; "completions": /v1/completions, for servers without chat
    template: str = JUDGE_TEMPLATE  # {prompt}, {completion} and any dataset column {NAME}; a literal brace doubled
    system_prompt: str | None = None  # a system message before the template's (api=chat)
    score_pattern: str = r"(-?\d+(?:\.\d+)?)"  # its last match in the answer (its first group, if any) is the score
    score_min: float = 0.0  # the judge's score that becomes reward 0.0; below it: a failure
    score_max: float = 10.0  # the judge's score that becomes reward 1.0 (linear between); above it: a failure
    max_tokens: int = 512  # the judge's answer, at most
    temperature: float = 0.0  # the judge's sampling temperature; 0: greedy, the same answer each time
    # Sent as a bearer token, to base_url's host alone; e.g. reward.judge.api_key='${oc.env:OPENAI_API_KEY}'. A secret:
    # written to no file (grpo_kit.contract.secrets).
    api_key: str | None = secret()
    concurrency: int = 8  # requests in flight at once
    timeout_s: float = 30.0  # per request; the whole batch is also bounded by trainer.reward_timeout
    retries: int = 2  # further attempts after a request fails to get an answer (no connection, timeout, 429, 5xx)
    retry_delay_s: float = 0.5  # before the first retry, doubling after each
    on_failure: str = "zero"  # a row without a usable score: "zero" (0.0, counted in rewards/judge/failed_rows), "stop"


@dataclass
class CodeExecutionConfig(RewardConfig):
    tests_column: str = "tests"  # the dataset column of each row's tests: python source, one string or a list
    timeout_s: float = 5.0  # wall clock per completion (and its CPU time, rounded up); then its processes are killed
    memory_mb: int = 512  # address space per process (RLIMIT_AS)
    # All it may write, its stdout and stderr included: the size of its folder's tmpfs (unconfined: of each file).
    max_output_bytes: int = 1_000_000
    max_processes: int = 16  # processes and threads it may run at once (RLIMIT_NPROC in its own user namespace)
    workers: int = 4  # completions run at once
    partial_credit: bool = False  # false: 1.0 when every test passes, else 0.0; true: the fraction of tests passed
    # "sandbox": each program confined (docs/rewards.md); the run refuses to start where this machine cannot.
    # "unsafe_unconfined": no sandbox, for code you trust only.
    isolation: str = "sandbox"
    reward_timeout: float = II("oc.select:trainer.reward_timeout,60")  # the batch's bound, which timeout_s must fit


@dataclass
class EnvironmentRewardConfig(RewardConfig):
    environment: str | None = II("oc.select:environment.name,null")  # the run's +environment, checked at start
