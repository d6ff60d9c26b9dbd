"""code_execution: runs each completion's code against its row's tests in a sandbox; 1.0 when every test passes.

The code is the completion's last fenced block marked ```python (or ```py), or the whole completion when it has
none: a model asked for code alone may answer with bare code, and one that explains itself fences what it means
to run. The tests come from a dataset column (`tests` unless `tests_column` names another): python source, a list
of strings, each one test (an `assert`, or any statements), or one string, a single test. They run after the code,
one after another, in a grader process that reaches the code's names through its process (sandbox_grader.py).
The score is 1.0 when every test passes, else 0.0; with `partial_credit=true`, the fraction of the tests that
pass. A program that raises, runs past `timeout_s`, or is killed for its resources scores 0.0; a row the sandbox
could not be set up for scores None (no opinion), with a warning.

Each completion runs in a sandbox of its own (sandbox.py and the modules it names), `workers` at a time. The run
refuses to start where this machine cannot build it, unless `isolation=unsafe_unconfined` says the code is
trusted. docs/rewards.md says what the sandbox guarantees and what it does not.
"""

import concurrent.futures
import logging
import math
import re
import sys

from grpo_kit import ConfigError, RewardError
from grpo_kit_rewards import sandbox_folders
from grpo_kit_rewards.sandbox import ISOLATION, STARTUP_ALLOWANCE_S, Limits, Outcome, run_sandboxed
from grpo_kit_rewards.text import completion_text

log = logging.getLogger(__name__)

FENCED_PYTHON = re.compile(r"```(?:python|py)[ \t]*\n(.*?)```", re.DOTALL)
WHAT_TO_DO = (
    "The sandbox needs Linux with user namespaces and seccomp: as a user, allow unprivileged user namespaces "
    "(sysctl user.max_user_namespaces > 0; kernel.unprivileged_userns_clone=1 on Debian's older kernels; "
    "kernel.apparmor_restrict_unprivileged_userns=0 on Ubuntu); in a container, run one that permits unshare and "
    "mount (docker run --security-opt seccomp=unconfined --security-opt apparmor=unconfined, or as --privileged). "
    "For code you trust, and only then, reward.code_execution.isolation=unsafe_unconfined runs it without the "
    "sandbox (docs/rewards.md says what that leaves open)."
)


class CodeExecution:
    def __init__(self, config):
        if config.isolation not in ISOLATION:
            raise ConfigError(
                f"reward.code_execution.isolation={config.isolation} is not one of: {', '.join(ISOLATION)}. "
                "`sandbox` confines each program and refuses to start where it cannot; `unsafe_unconfined` runs "
                "programs without a sandbox, for code you trust."
            )
        if config.timeout_s <= 0 or config.memory_mb < 16 or config.max_processes < 1 or config.workers < 1:
            raise ConfigError(
                "reward.code_execution needs timeout_s > 0, memory_mb >= 16 (the interpreter's own), "
                "max_processes >= 1 and workers >= 1."
            )
        if config.max_output_bytes < 4096:
            raise ConfigError(
                f"reward.code_execution.max_output_bytes={config.max_output_bytes}: the program's folder needs "
                "4096 bytes at least (one page of its tmpfs)."
            )
        # A run resolves it from trainer.reward_timeout; a config built by hand, outside a run, leaves the
        # interpolation as it is, and no batch bound applies there.
        self.reward_timeout = config.reward_timeout if isinstance(config.reward_timeout, (int, float)) else None
        if self.reward_timeout is not None and config.timeout_s + STARTUP_ALLOWANCE_S > self.reward_timeout:
            raise ConfigError(
                f"reward.code_execution.timeout_s={config.timeout_s:g} (plus {STARTUP_ALLOWANCE_S:g} s for the sandbox "
                f"to start) does not fit trainer.reward_timeout={config.reward_timeout:g}, the bound on scoring a "
                "whole batch, past which its rows get None: raise trainer.reward_timeout or lower timeout_s."
            )
        self.tests_column, self.workers, self.partial_credit = (
            config.tests_column,
            config.workers,
            config.partial_credit,
        )
        self.limits = Limits(
            config.timeout_s, config.memory_mb, config.max_output_bytes, config.max_processes, config.isolation
        )
        self.warned: set[str] = set()
        swept = sandbox_folders.sweep()
        if swept:
            log.info("Removed %d program folders that killed runs left behind.", swept)
        self._probe()

    @property
    def required_columns(self) -> list[str]:
        return [self.tests_column]

    def __call__(self, prompts, completions, completion_ids, **columns) -> list[float | None]:
        tests = [as_tests(row_tests) for row_tests in columns[self.tests_column]]
        codes = [code_of(completion_text(completion)) for completion in completions]
        longest = math.ceil(len(codes) / self.workers) * (self.limits.timeout_s + STARTUP_ALLOWANCE_S)
        if self.reward_timeout is not None and longest > self.reward_timeout:
            self._warn_once(
                "batch",
                f"A batch of {len(codes)} completions, {self.workers} at a time, may take up to {longest:g} s, more "
                f"than trainer.reward_timeout={self.reward_timeout:g}: the rows still running then get None. Raise "
                "trainer.reward_timeout or reward.code_execution.workers, or lower timeout_s.",
            )
        with concurrent.futures.ThreadPoolExecutor(self.workers) as pool:  # each thread waits on its process
            outcomes = list(pool.map(run_sandboxed, codes, tests, [self.limits] * len(codes)))
        return [self.score(outcome) for outcome in outcomes]

    def score(self, outcome: Outcome) -> float | None:
        if not outcome.sandboxed:
            self._warn_once("sandbox", f"The code_execution sandbox could not be set up for a row: {outcome.error}")
            return None
        if self.partial_credit:
            return outcome.passed / outcome.total if outcome.total else 0.0
        return float(outcome.total > 0 and outcome.passed == outcome.total)

    def _probe(self) -> None:
        """Runs a program that must pass, once, so that a machine that cannot sandbox stops the run before it trains."""
        if self.limits.isolation == "sandbox" and sys.platform != "linux":
            raise ConfigError(f"reward.code_execution cannot sandbox programs on {sys.platform}. {WHAT_TO_DO}")
        outcome = run_sandboxed("x = 1", ["assert x == 1"], self.limits)
        if not outcome.sandboxed:
            raise ConfigError(f"reward.code_execution cannot sandbox programs here: {outcome.error}. {WHAT_TO_DO}")
        if outcome.passed != 1:
            raise ConfigError(f"reward.code_execution cannot run even a one-line program: {outcome.error}.")
        if self.limits.isolation == "unsafe_unconfined":
            log.warning(
                "reward.code_execution.isolation=unsafe_unconfined: programs run without a sandbox, as this user, "
                "with this user's files, network and processes in reach. For code you trust only."
            )

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self.warned:
            self.warned.add(key)
            log.warning(message)


def code_of(completion: str) -> str:
    blocks = FENCED_PYTHON.findall(completion)
    return blocks[-1] if blocks else completion


def as_tests(tests) -> list[str]:
    if isinstance(tests, str):
        return [tests]
    if isinstance(tests, (list, tuple)) and all(isinstance(test, str) for test in tests):
        return list(tests)
    raise RewardError(
        f"A row's tests must be python source, a string or a list of strings, got {type(tests).__name__}: "
        f"{str(tests)[:100]}"
    )
