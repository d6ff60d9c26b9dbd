"""Runs a program and its tests in a sandboxed subprocess (sandbox_child.py), and removes every trace of it.

The trainer's side: a fresh temporary folder (the program's working directory, HOME and TMPDIR), a child process in
a session of its own, a wall-clock limit after which the whole process group is killed, the result read from a
pipe of its own (at most RESULT_BYTES), and the folder removed however the program ended.
"""

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

CHILD = str(Path(__file__).with_name("sandbox_child.py"))
RESULT_BYTES = 65536
STARTUP_ALLOWANCE_S = 1.0  # the child's interpreter starts and isolates itself before the program's clock runs


@dataclass
class Limits:
    timeout_s: float = 5.0
    memory_mb: int = 512
    max_output_bytes: int = 1_000_000
    max_processes: int = 16
    isolation: str = "auto"  # auto | namespaces | fallback


@dataclass
class Outcome:
    passed: int
    total: int
    error: str | None  # why not every test passed
    isolation: dict[str, bool] | None  # network, filesystem, processes: what namespaces isolated (None: no report)


def run_sandboxed(code: str, tests: list[str], limits: Limits) -> Outcome:
    root = Path(tempfile.mkdtemp(prefix="grpo_kit-sandbox-"))
    try:
        work = root / "work"
        work.mkdir()
        return _run(code, tests, limits, work)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _run(code: str, tests: list[str], limits: Limits, work: Path) -> Outcome:
    read_end, write_end = os.pipe()
    settings = {
        "work": str(work),
        "result_fd": write_end,
        "timeout_s": limits.timeout_s,
        "memory_mb": limits.memory_mb,
        "max_output_bytes": limits.max_output_bytes,
        "max_processes": limits.max_processes,
        "isolation": limits.isolation,
    }
    environment = {"PATH": os.defpath, "HOME": str(work), "TMPDIR": str(work), "LANG": "C.UTF-8"}
    environment |= dict.fromkeys(("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"), "1")
    try:
        process = subprocess.Popen(
            [sys.executable, "-I", CHILD, json.dumps(settings)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=work,
            env=environment,
            pass_fds=(write_end,),
            start_new_session=True,  # its own process group, killed as one
        )
    finally:
        os.close(write_end)
    timed_out = False
    try:
        try:
            process.communicate(
                json.dumps({"code": code, "tests": tests}).encode(), timeout=limits.timeout_s + STARTUP_ALLOWANCE_S
            )
        except subprocess.TimeoutExpired:
            timed_out = True
        _kill_group(process.pid)  # the child, and whatever it left behind
        process.wait()
        result = _read(read_end)
    finally:
        os.close(read_end)
    if timed_out:
        return Outcome(0, len(tests), f"timed out after {limits.timeout_s:g} s", None)
    try:
        report = json.loads(result)
    except ValueError:
        return Outcome(0, len(tests), f"ended without a result ({_ending(process.returncode)})", None)
    return Outcome(report["passed"], len(tests), report["error"], report["isolation"])


def _ending(code: int) -> str:
    number = -code if code < 0 else code - 128  # the child's own death, or its program's, as PID 1 reports it
    if number == signal.SIGXCPU:
        return "its CPU time ran out"
    if 0 < number < signal.NSIG:
        return f"killed by {signal.Signals(number).name}"
    return f"exit code {code}"


def _kill_group(group: int) -> None:
    try:
        os.killpg(group, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # nothing left of it
        pass


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
