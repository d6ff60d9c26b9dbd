"""Runs a program and its tests in the sandbox, from the trainer: the grader process (sandbox_child.py) does the rest.

The trainer's side: the grader process, started in a session of its own with a clean environment and the row's code
and tests on its stdin; a wall-clock limit after which its process group is killed (the sandbox's processes die
with it); its report, read from a pipe of its own (at most RESULT_BYTES) and checked, so that a report that is not
one the grader writes scores 0 for its row alone. With isolation=unsafe_unconfined, the program's folder is a
temporary folder here (sandbox_folders.py); in the sandbox, it is a tmpfs in the sandbox's own mount namespace.
"""

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from grpo_kit_rewards import sandbox_folders

RESULT_BYTES = 65536
STARTUP_ALLOWANCE_S = 2.0  # the grader and the program's interpreter start, and the sandbox is built, first
# The grader's entry, run with -I -S: no environment variable, user site or .pth file of the trainer's reaches it,
# and its package is found by path.
LAUNCH = (
    f"import sys; sys.path.insert(0, {str(Path(__file__).parents[1])!r}); "
    "from grpo_kit_rewards.sandbox_child import main; main()"
)
ISOLATION = ("sandbox", "unsafe_unconfined")


@dataclass
class Limits:
    timeout_s: float = 5.0
    memory_mb: int = 512
    max_output_bytes: int = 1_000_000
    max_processes: int = 16
    isolation: str = "sandbox"  # one of ISOLATION


@dataclass
class Outcome:
    passed: int
    total: int
    error: str | None  # why not every test passed
    sandboxed: bool = True  # False: the sandbox could not be set up and nothing ran; `error` says why


def run_sandboxed(code: str, tests: list[str], limits: Limits) -> Outcome:
    if limits.isolation not in ISOLATION:
        raise ValueError(f"isolation={limits.isolation!r} is not one of {', '.join(ISOLATION)}")
    if limits.isolation == "sandbox":
        return _run(code, tests, limits, work=None)
    with sandbox_folders.folder() as work:
        return _run(code, tests, limits, work)


def _run(code: str, tests: list[str], limits: Limits, work: str | None) -> Outcome:
    read_end, write_end = os.pipe()
    settings = {
        "result_fd": write_end,
        "work": work,
        "timeout_s": limits.timeout_s,
        "memory_mb": limits.memory_mb,
        "max_output_bytes": limits.max_output_bytes,
        "max_processes": limits.max_processes,
        "isolation": limits.isolation,
    }
    try:
        process = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", LAUNCH, json.dumps(settings)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd="/",
            env={"PATH": os.defpath, "LANG": "C.UTF-8"},  # none of the trainer's secrets
            pass_fds=(write_end,),
            start_new_session=True,  # its own process group, killed as one
        )
    finally:
        os.close(write_end)
    timed_out = False
    try:
        try:
            job = json.dumps({"code": code, "tests": tests}).encode()
            process.communicate(job, timeout=limits.timeout_s + STARTUP_ALLOWANCE_S)
        except subprocess.TimeoutExpired:
            timed_out = True
        with contextlib.suppress(ProcessLookupError, PermissionError):  # nothing left of it
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        result = _read(read_end)
    finally:
        os.close(read_end)
    if timed_out:
        return Outcome(0, len(tests), f"timed out after {limits.timeout_s:g} s")
    return parse_report(result, len(tests))


def parse_report(data: bytes, total: int) -> Outcome:
    """The grader's report, checked: anything but what it writes scores 0."""
    try:
        report = json.loads(data)
    except ValueError:
        return Outcome(0, total, "the sandbox ended without a report")
    if type(report) is dict and list(report) == ["sandbox_error"] and type(report["sandbox_error"]) is str:
        return Outcome(0, total, report["sandbox_error"], sandboxed=False)
    if (
        type(report) is dict
        and sorted(report) == ["error", "passed", "total"]
        and type(report["passed"]) is int
        and report["total"] == total
        and 0 <= report["passed"] <= total
        and (report["error"] is None or type(report["error"]) is str)
    ):
        return Outcome(report["passed"], total, report["error"])
    return Outcome(0, total, f"the sandbox's report is malformed: {data[:200]!r}")


def _read(fd: int) -> bytes:
    """What the pipe holds, up to RESULT_BYTES, without waiting for a writer that may linger."""
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
    chunks, size = [], 0
    while size < RESULT_BYTES:
        try:
            chunk = os.read(fd, RESULT_BYTES - size)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)
