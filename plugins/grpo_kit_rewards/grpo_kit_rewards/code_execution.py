"""code_execution: runs each completion's code against its row's tests in a sandbox; 1.0 when every test passes.

The code is the completion's last fenced block marked ```python (or ```py), or the whole completion when it has
none: a model asked for code alone may answer with bare code, and one that explains itself fences what it means
to run. The tests come from a dataset column (`tests` unless `tests_column` names another): python source, a list
of strings, each one test (an `assert`, or any statements), or one string, a single test. They run after the code,
in its namespace, one after another. The score is 1.0 when every test passes, else 0.0; with
`partial_credit=true`, the fraction of the tests that pass. A program that raises, runs past `timeout_s`, or is
killed for its resources scores 0.0.

Each completion runs in a process of its own (sandbox.py, sandbox_child.py), `workers` at a time: time, memory,
file-size and process limits, no network, a read-only filesystem but its own temporary folder, which is removed
afterwards. docs/rewards.md says what the sandbox contains, and what its fallback does not, where the OS refuses
namespaces.
"""

import concurrent.futures
import logging
import re

from grpo_kit import ConfigError, RewardError
from grpo_kit_rewards.sandbox import Limits, Outcome, run_sandboxed
from grpo_kit_rewards.text import completion_text

log = logging.getLogger(__name__)

FENCED_PYTHON = re.compile(r"```(?:python|py)[ \t]*\n(.*?)```", re.DOTALL)
ISOLATION = ("auto", "namespaces", "fallback")


class CodeExecution:
    def __init__(self, config):
        if config.isolation not in ISOLATION:
            raise ConfigError(
                f"reward.code_execution.isolation={config.isolation} is not one of: {', '.join(ISOLATION)}."
            )
        if config.timeout_s <= 0 or config.memory_mb < 16 or config.max_processes < 1 or config.workers < 1:
            raise ConfigError(
                "reward.code_execution needs timeout_s > 0, memory_mb >= 16 (the interpreter's own), "
                "max_processes >= 1 and workers >= 1."
            )
        self.tests_column, self.workers, self.partial_credit = (
            config.tests_column,
            config.workers,
            config.partial_credit,
        )
        self.limits = Limits(
            config.timeout_s, config.memory_mb, config.max_output_bytes, config.max_processes, config.isolation
        )
        self.isolation = self._probe()

    @property
    def required_columns(self) -> list[str]:
        return [self.tests_column]

    def __call__(self, prompts, completions, completion_ids, **columns) -> list[float]:
        tests = [as_tests(row_tests) for row_tests in columns[self.tests_column]]
        codes = [code_of(completion_text(completion)) for completion in completions]
        with concurrent.futures.ThreadPoolExecutor(self.workers) as pool:  # each thread waits on its process
            outcomes = list(pool.map(run_sandboxed, codes, tests, [self.limits] * len(codes)))
        return [self.score(outcome) for outcome in outcomes]

    def score(self, outcome: Outcome) -> float:
        if self.partial_credit:
            return outcome.passed / outcome.total if outcome.total else 0.0
        return float(outcome.total > 0 and outcome.passed == outcome.total)

    def _probe(self) -> dict[str, bool]:
        """What the sandbox isolates on this machine, said once at the start of a run."""
        outcome = run_sandboxed("", ["pass"], self.limits)
        if outcome.isolation is None or outcome.passed != 1:
            raise ConfigError(
                f"reward.code_execution cannot run even an empty program in its sandbox: {outcome.error}."
            )
        missing = [part for part, isolated in outcome.isolation.items() if not isolated]
        if missing and self.limits.isolation == "namespaces":
            raise ConfigError(
                f"reward.code_execution.isolation=namespaces, but this machine does not isolate: {', '.join(missing)}. "
                "Allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, Linux >= 5.12 for "
                "the read-only filesystem), or set isolation=auto to run with the fallback."
            )
        if missing and self.limits.isolation == "auto":
            log.warning(
                "The code_execution sandbox runs without namespaces for: %s (the OS refused them); its fallback "
                "guards these in the program's interpreter only (docs/rewards.md says what it does not stop). "
                "reward.code_execution.isolation=namespaces refuses to run without them.",
                ", ".join(missing),
            )
        return outcome.isolation


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
