"""Hostile programs against the sandbox (issue 44, items 1, 2, 4 and 5): each tries to get out, and is contained.

Every program is written as an attacker would write it and is run through the real sandbox; the tests check from
outside (this process, the filesystem, the process table) that nothing it tried landed.
"""

import dataclasses
import multiprocessing.forkserver
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from grpo_kit_rewards.sandbox import Limits, run_sandboxed

SMALL = Limits(timeout_s=2.0, memory_mb=256, max_output_bytes=100_000, max_processes=16)


def run(code: str, tests=("assert True",), **changes):
    return run_sandboxed(code, list(tests), dataclasses.replace(SMALL, **changes))


def processes_with(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
            except OSError:  # it ended
                pass
    return found


# Item 1: no socket of any family.

CONNECT = """
import socket
family, address = {family}, {address!r}
try:
    with socket.socket(family, socket.SOCK_STREAM) as connection:
        connection.settimeout(0.5)
        connection.connect(address)
        connection.sendall(b"escaped")
    reached = True
except OSError as error:
    reached = str(error)
"""


@pytest.mark.parametrize("kind", ["unix-path", "unix-abstract", "tcp-loopback"])
def test_no_listening_socket_of_this_user_is_reachable(kind, tmp_path):
    """A network namespace does not isolate a path-bound unix socket, nor a read-only mount its connect()."""
    family = socket.AF_INET if kind == "tcp-loopback" else socket.AF_UNIX
    with socket.socket(family, socket.SOCK_STREAM) as listener:
        address = {
            "unix-path": str(tmp_path / "listener"),
            "unix-abstract": f"\0grpo_kit-test-{uuid.uuid4().hex}",
            "tcp-loopback": ("127.0.0.1", 0),
        }[kind]
        listener.bind(address)
        listener.listen()
        listener.settimeout(0.2)
        address = listener.getsockname() if kind == "tcp-loopback" else address
        outcome = run(CONNECT.format(family=int(family), address=address), ["assert reached is not True, reached"])
        with pytest.raises(TimeoutError):
            listener.accept()
    assert outcome.passed == 1, outcome.error


FORKSERVER_EXPLOIT = """
import array, glob, os, pickle, socket
class Payload:
    def __reduce__(self):
        return os.system, ("echo escaped > {marker}",)
found = [path for path in [{listener!r}, *glob.glob("/tmp/pymp-*/listener-*")] if os.path.exists(path)]
sent = []
for path in found:
    try:
        payload, writer = os.pipe()
        os.write(writer, pickle.dumps(Payload()))
        connection = socket.socket(socket.AF_UNIX)
        connection.connect(path)
        fds = [payload, writer, payload, writer]  # the forkserver unpickles from the first
        connection.sendmsg([bytes([len(fds)])], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
        sent.append(path)
    except OSError:
        pass
"""


def test_the_trainers_forkserver_is_out_of_reach():
    """The issue's escape: the trainer's multiprocessing forkserver runs any pickle sent to its socket. The program
    is told the listener's path, as an attacker who guessed it would know it."""
    multiprocessing.forkserver.ensure_running()
    listener = multiprocessing.forkserver._forkserver._forkserver_address
    assert os.path.exists(listener)
    marker = Path("/tmp") / f"grpo_kit-escaped-{uuid.uuid4().hex}"
    outcome = run(FORKSERVER_EXPLOIT.format(marker=marker, listener=listener), ["assert found == [] and sent == []"])
    time.sleep(0.5)  # the forkserver's child, had it been reached, writes the marker by now
    assert not marker.exists() and outcome.passed == 1, outcome.error


FIND_SOCKETS = """
import os, stat
sockets, top = [], sorted(os.listdir("/"))
for folder, folders, files in os.walk("/"):
    for name in folders + files:
        path = os.path.join(folder, name)
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            sockets.append(path)
where = os.getcwd()
host = os.uname().nodename
"""


def test_the_program_sees_no_socket_file_and_a_minimal_tree():
    outcome = run(
        FIND_SOCKETS,
        [
            "assert sockets == [], sockets",
            "assert not {'proc', 'sys', 'tmp', 'home', 'run', 'var', 'mnt'} & set(top), top",
            "assert where == '/work'",
            "assert host == 'sandbox'",
        ],
        timeout_s=10.0,
    )
    assert outcome.passed == 4, outcome.error


# Item 2: what the fallback let through, tried in the sandbox and unconfined.

OUTSIDE = """
import ctypes, os, shutil
canary, folder = {canary!r}, {folder!r}
attempts = {{}}
def attempt(name, action):
    try:
        action()
        attempts[name] = "done"
    except Exception as error:
        attempts[name] = type(error).__name__
attempt("remove", lambda: os.remove(canary))
attempt("rename", lambda: os.rename(canary, canary + ".moved"))
attempt("chmod", lambda: os.chmod(canary, 0o777))
attempt("rmtree", lambda: shutil.rmtree(folder))
attempt("link", lambda: os.link(canary, os.path.join(folder, "hardlink")))
def through_dir_fd():
    fd = os.open(folder, os.O_RDONLY)
    os.close(os.open("via_dir_fd", os.O_WRONLY | os.O_CREAT, dir_fd=fd))
attempt("dir_fd", through_dir_fd)
def system():
    status = ctypes.pythonapi.system(("touch " + os.path.join(folder, "via_system")).encode())
    assert status == 0, status
attempt("system", system)
attempt("environ", lambda: open("/proc/%d/environ" % os.getppid()).read())
"""


def test_files_outside_its_folder_are_out_of_reach(tmp_path):
    folder = tmp_path / "trainer"
    folder.mkdir()
    canary = folder / "canary"
    canary.write_text("kept")
    canary.chmod(0o600)
    tests = ["assert 'done' not in attempts.values(), attempts"]
    outcome = run(OUTSIDE.format(canary=str(canary), folder=str(folder)), tests)
    assert sorted(os.listdir(folder)) == ["canary"] and canary.read_text() == "kept"
    assert canary.stat().st_mode & 0o777 == 0o600
    assert outcome.passed == 1, outcome.error


KILL_THE_PARENT = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)"
# Every process it may signal: in the sandbox, its own namespace's. Never run unconfined: as root, that is the machine.
KILL_EVERYTHING = KILL_THE_PARENT + "\ntry:\n    os.kill(-1, signal.SIGKILL)\nexcept OSError:\n    pass"

TRAINER = """
import sys
sys.path.insert(0, {package!r})
from grpo_kit_rewards.sandbox import Limits, run_sandboxed
outcome = run_sandboxed({code!r}, ["assert True"], Limits(timeout_s=2.0, memory_mb=256, isolation={isolation!r}))
print("survived", outcome.error)
"""


@pytest.mark.parametrize("isolation", ["sandbox", "unsafe_unconfined"])
def test_the_program_cannot_kill_the_trainer(isolation):
    """The fallback's program was the trainer's child: os.kill(os.getppid(), SIGKILL) stopped the run (exit 137)."""
    package = str(Path(__file__).parents[1])
    code = KILL_EVERYTHING if isolation == "sandbox" else KILL_THE_PARENT
    trainer = TRAINER.format(package=package, code=code, isolation=isolation)
    finished = subprocess.run([sys.executable, "-c", trainer], capture_output=True, text=True, timeout=60)
    assert finished.returncode == 0 and "survived" in finished.stdout, finished.stderr


SLEEPER = "import time; time.sleep(60)"
DETACHED = {
    "fork": f"""
import os, sys
if os.fork() == 0:
    os.setsid()  # out of the sandbox's process group, and session
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", {SLEEPER!r}, "{{marker}}"])
    os._exit(0)
""",
    # No audit event, no Python-level fork: what the fallback's audit hook never saw.
    "system": f"""
import ctypes, sys
ctypes.pythonapi.system(("setsid %s -c '{SLEEPER}' {{marker}} &" % sys.executable).encode())
""",
}


@pytest.mark.parametrize(
    "isolation, how", [("sandbox", "fork"), ("unsafe_unconfined", "fork"), ("unsafe_unconfined", "system")]
)
def test_a_detached_process_does_not_outlive_its_program(isolation, how):
    marker = f"grpo_kit-detached-{uuid.uuid4().hex}"
    try:
        outcome = run(DETACHED[how].format(marker=marker), isolation=isolation)
        assert outcome.passed == 1, outcome.error
        assert processes_with(marker) == []
    finally:
        for pid in processes_with(marker):  # a failure here leaves no sleeper behind
            os.kill(pid, 9)


SECRETS = """
import os
seen = dict(os.environ)
parent = open("/proc/%d/environ" % os.getppid()).read() if os.path.exists("/proc") else ""
"""


def test_an_unconfined_program_gets_none_of_the_trainers_environment(monkeypatch):
    monkeypatch.setenv("GRPO_KIT_TEST_SECRET", "hunter2")
    outcome = run(
        SECRETS,
        ["assert not any('hunter2' in value for value in seen.values())", "assert 'hunter2' not in parent"],
        isolation="unsafe_unconfined",
    )
    assert outcome.passed == 2, outcome.error


# Item 4: the disk.

FILL = """
import os
written = 0
for index in range(10):
    try:
        with open("file%d" % index, "wb") as file:
            written += file.write(b"x" * {size})
    except OSError:
        break
os.chmod(".", 0)
"""


def test_all_it_writes_is_bounded_and_nothing_lands_on_the_trainers_disk(tmp_path, monkeypatch):
    """max_output_bytes bounds the total: ten files of 60% each stop at the second."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    outcome = run(FILL.format(size=60_000), [f"assert written <= {SMALL.max_output_bytes}, written"])
    assert outcome.passed == 1, outcome.error
    assert list(tmp_path.iterdir()) == []


# Item 5: processes and threads, under root too.

SPAWN = """
import os, threading, time
threading.stack_size(256 * 1024)  # so that the address space, 1 GiB here, is not what stops them
started = 0
def wait():
    time.sleep(0.5)
try:
    for _ in range(40):
        {start}
        started += 1
except (OSError, RuntimeError):  # fork: EAGAIN; threads: "can't start new thread"
    pass
"""


@pytest.mark.parametrize(
    "start",
    ["threading.Thread(target=wait).start()", "os.fork() or (wait(), os._exit(0))"],
    ids=["threads", "processes"],
)
def test_processes_and_threads_are_held_to_max_processes(start):
    """RLIMIT_NPROC counts threads too, but Linux exempts root: the sandbox maps root to an unprivileged user."""
    outcome = run(SPAWN.format(start=start), ["assert started < 8, started"], max_processes=8, memory_mb=1024)
    assert outcome.passed == 1, outcome.error
