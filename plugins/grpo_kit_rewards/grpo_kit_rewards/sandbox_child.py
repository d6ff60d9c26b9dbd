"""The sandbox's grader process (started by sandbox.py, in a session of its own with a clean environment).

It starts the program's process, confined (sandbox_namespaces.py, sandbox_seccomp.py) or, with
isolation=unsafe_unconfined, not; grades the row's tests against it (sandbox_grader.py); writes
`{"passed", "total", "error"}`, or `{"sandbox_error"}` where the sandbox could not be set up, as JSON to the result
pipe, which no process of the program ever holds; then kills every process the program left.
"""

import contextlib
import ctypes
import fcntl
import json
import os
import resource
import signal
import sys
import time
from pathlib import Path

from grpo_kit_rewards import sandbox_namespaces, sandbox_program, sandbox_seccomp
from grpo_kit_rewards.sandbox_grader import Program, describe, grade
from grpo_kit_rewards.sandbox_program import REQUESTS_FD, RESPONSES_FD, Ended, ProtocolError, receive, send

RUNNER = Path(sandbox_program.__file__).read_text()  # read now: the confined program's root does not hold it
MESSAGE_BYTES = 4 * 2**20  # the largest answer the program may give
PR_SET_CHILD_SUBREAPER = 36
ENDING_WAIT_S = 1.0  # for the program's process to be reaped once its pipe closed, to say how it ended


class SandboxError(Exception):
    """The sandbox could not be set up: no program ran."""


def main() -> None:
    settings = json.loads(sys.argv[1])
    report = grade_row(settings)
    with os.fdopen(settings["result_fd"], "w") as results:
        results.write(json.dumps(report))


def grade_row(settings: dict) -> dict:
    confined = settings["isolation"] == "sandbox"
    try:
        exposed = sandbox_namespaces.exposed_paths() if confined else []
    except OSError as error:
        return {"sandbox_error": f"finding what the program's interpreter needs: {error}"}
    if not confined:  # what the program leaves running, even detached with setsid, comes back here to be killed
        ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    requests, responses = os.pipe(), os.pipe()
    child = os.fork()
    if child == 0:
        start(settings, exposed, requests[0], responses[1])
    os.close(requests[0])
    os.close(responses[1])
    ended = Ending(child, confined)
    program = Program(requests[1], responses[0], MESSAGE_BYTES, ended.describe)
    try:
        set_up(program, child, confined, ended)
        job = json.loads(sys.stdin.read())
        passed, error = grade(program, job["code"], job["tests"], settings["timeout_s"])
        return {"passed": passed, "total": len(job["tests"]), "error": error}
    except SandboxError as error:
        return {"sandbox_error": str(error)}
    finally:
        stop(child, confined, ended)


def start(settings: dict, exposed: list[str], requests: int, responses: int) -> None:
    """The forked process: it becomes the program (through the sandbox's namespaces, when confined); never returns."""
    try:
        # Out of the way first, then into place, inheritable: either may already sit on 3 or 4.
        moved = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (requests, responses)]
        for fd, target in zip(moved, (REQUESTS_FD, RESPONSES_FD)):
            os.dup2(fd, target)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)  # not the job on the grader's stdin
        os.closerange(RESPONSES_FD + 1, os.sysconf("SC_OPEN_MAX"))  # the result pipe above all
        libc = ctypes.CDLL(None, use_errno=True)
        sandbox_namespaces.die_with_parent(libc)
        if settings["isolation"] == "sandbox":
            os.setpgid(0, 0)  # a group the grader kills whole; its init's death ends the rest
            interpreter = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
            sandbox_namespaces.confine(
                exposed,
                settings["max_output_bytes"],
                lambda: become_program(settings, interpreter, sandbox_namespaces.WORK, confined=True),
            )
        become_program(settings, sys.executable, settings["work"], confined=False)
    except BaseException as failure:
        with contextlib.suppress(OSError):
            send(RESPONSES_FD, {"setup_error": describe(failure)})
    os._exit(1)


def become_program(settings: dict, interpreter: str, work: str, confined: bool) -> None:
    os.chdir(work)
    limit(settings, confined)
    for fd, name in ((1, "stdout"), (2, "stderr")):  # files in its folder, within its disk
        output = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(output, fd)
        os.close(output)
    environment = {"PATH": "/usr/bin:/bin", "HOME": work, "TMPDIR": work, "LANG": "C.UTF-8"}
    environment |= dict.fromkeys(("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"), "1")
    if confined:
        sandbox_seccomp.install()
    # Confined, -S: the standard library alone, no site-packages; unconfined, the interpreter as the trainer has it.
    flags = ["-I", "-S"] if confined else ["-I"]
    os.execve(interpreter, [interpreter, *flags, "-c", RUNNER, str(MESSAGE_BYTES)], environment)


def limit(settings: dict, confined: bool) -> None:
    cpu = -(-settings["timeout_s"] // 1)
    resource.setrlimit(resource.RLIMIT_CPU, (int(cpu), int(cpu) + 1))  # SIGXCPU at the first, SIGKILL after
    limits = {
        resource.RLIMIT_AS: settings["memory_mb"] * 2**20,
        resource.RLIMIT_FSIZE: settings["max_output_bytes"],
        resource.RLIMIT_CORE: 0,
    }
    if confined:  # its user namespace's own count: the program's processes and threads, and the sandbox's init and
        # the process that started it (unconfined, it would count every process of the trainer's user)
        limits[resource.RLIMIT_NPROC] = settings["max_processes"] + 2
    for name, value in limits.items():
        resource.setrlimit(name, (value, value))


def set_up(program: Program, child: int, confined: bool, ended: "Ending") -> None:
    """The sandbox's start, up to the program's interpreter saying it is ready (raises SandboxError)."""
    if confined and os.geteuid() == 0:
        expect(program, {"map_ids": True}, ended)
        try:
            sandbox_namespaces.map_to_nobody(child)
        except OSError as error:
            raise SandboxError(f"mapping the sandbox's user to nobody: {error}") from None
        send(program.requests, {"go": True})
    expect(program, {"ready": True}, ended)


def expect(program: Program, message: dict, ended: "Ending") -> None:
    try:
        received = receive(program.responses, 65536)
    except Ended:
        raise SandboxError(f"the sandbox's process ended while starting ({ended.describe()})") from None
    except ProtocolError as error:
        raise SandboxError(f"the sandbox's process sent {error}") from None
    if received != message:
        raise SandboxError(str(received.get("setup_error", received)) if type(received) is dict else str(received))


class Ending:
    """How the forked process ended: the program itself (unconfined), or the sandbox's, which ends with its init,
    which exits with the program's status as a shell reports it (128 + a signal's number)."""

    def __init__(self, child: int, confined: bool):
        self.child, self.confined, self.code = child, confined, None

    def reap(self, block: bool) -> None:
        if self.code is None:
            pid, status = os.waitpid(self.child, 0 if block else os.WNOHANG)
            if pid:
                self.code = os.waitstatus_to_exitcode(status)

    def describe(self) -> str:
        waited_until = time.monotonic() + ENDING_WAIT_S
        while self.code is None and time.monotonic() < waited_until:
            self.reap(block=False)
            time.sleep(0.01)
        if self.code is None:
            return "it closed its pipe"
        number = -self.code if self.code < 0 else self.code - 128 if self.confined else 0
        if number == signal.SIGXCPU:
            return "its CPU time ran out"
        if 0 < number < signal.NSIG:
            return f"killed by {signal.Signals(number).name}"
        return f"exit code {self.code}"


def stop(child: int, confined: bool, ended: Ending) -> None:
    """Kills what is left of the program: the sandbox's group, whose init takes its namespace with it; unconfined,
    every process that came back to this one (children, and orphans, as their subreaper)."""
    if confined:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child, signal.SIGKILL)
        ended.reap(block=True)
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(child, signal.SIGKILL)
    ended.reap(block=True)
    while remaining := children():
        for pid in remaining:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


def children() -> list[int]:
    """This process's children, read from /proc (its subreaper's orphans among them)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == os.getpid():
                    found.append(int(entry))
    return found


if __name__ == "__main__":
    main()
