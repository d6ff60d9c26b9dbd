"""The sandbox's own process (run as a script, `python -I sandbox_child.py SETTINGS`, never imported by the trainer).

It isolates itself, then runs the program and its tests and writes `{"passed", "total", "error", "isolation"}` as
JSON to the result pipe. With namespaces (Linux, unprivileged user namespaces allowed): a user namespace, to hold
the others without root; a network namespace, with no interface but a loopback that is down; a mount namespace
whose whole tree is read-only but the program's folder; a PID namespace whose first process (here, `init`) kills
every process left, or every process once there are more than `max_processes`. Without them, the fallback: an
audit hook in the program's interpreter (docs/rewards.md says what it does not stop).
"""

import contextlib
import ctypes
import json
import math
import os
import resource
import signal
import sys
import time

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
MS_BIND, MS_REC, MS_PRIVATE = 0x1000, 0x4000, 0x40000
SYS_MOUNT_SETATTR, AT_FDCWD, AT_RECURSIVE, MOUNT_ATTR_RDONLY = 442, -100, 0x8000, 0x1
WATCH_INTERVAL_S = 0.005


class MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def main() -> None:
    settings = json.loads(sys.argv[1])
    job = json.loads(sys.stdin.read())
    results = os.fdopen(settings["result_fd"], "w")
    isolation = {"network": False, "filesystem": False, "processes": False}
    if settings["isolation"] != "fallback":
        try:
            isolation = isolate(settings["work"])
        except OSError as error:
            if settings["isolation"] == "namespaces":
                report(results, 0, job, f"isolation unavailable: {error}", isolation)
                return
    if not isolation["processes"]:  # no PID namespace: the program runs here, guarded by the audit hook
        run_program(job, settings, results, isolation)
        return
    init = os.fork()  # the first process of the new PID namespace
    if init == 0:
        os._exit(watch(job, settings, results, isolation))
    _, status = os.waitpid(init, 0)
    sys.exit(os.waitstatus_to_exitcode(status))


def isolate(work: str) -> dict:
    libc = ctypes.CDLL(None, use_errno=True)
    enter_user_namespace(libc, CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWPID)
    call = checked(libc)
    call(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "making mounts private")
    call(libc.mount(work.encode(), work.encode(), None, MS_BIND | MS_REC, None), "binding the folder")
    read_only, writable = MountAttr(attr_set=MOUNT_ATTR_RDONLY), MountAttr(attr_clr=MOUNT_ATTR_RDONLY)
    filesystem = (
        libc.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, b"/", AT_RECURSIVE, ctypes.byref(read_only), ctypes.sizeof(read_only))
        == 0
    )
    if filesystem:  # else (Linux < 5.12) the filesystem stays as it is; the report says so
        call(
            libc.syscall(
                SYS_MOUNT_SETATTR,
                AT_FDCWD,
                work.encode(),
                AT_RECURSIVE,
                ctypes.byref(writable),
                ctypes.sizeof(writable),
            ),
            "making the folder writable",
        )
    return {"network": True, "filesystem": filesystem, "processes": True}


def enter_user_namespace(libc, namespaces: int = 0) -> None:
    """A new user namespace (and `namespaces`), as the same user: inside it the process holds every capability,
    which act only on what that namespace owns."""
    uid, gid = os.getuid(), os.getgid()
    checked(libc)(libc.unshare(CLONE_NEWUSER | namespaces), "unshare")
    for name, mapping in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as file:
            file.write(mapping)


def checked(libc):
    def call(result: int, what: str) -> None:
        if result != 0:
            number = ctypes.get_errno()
            raise OSError(number, f"{what}: {os.strerror(number)}")

    return call


def watch(job: dict, settings: dict, results, isolation: dict) -> int:
    """PID 1 of the namespace: run the program, count the namespace's processes, kill them all at the end."""
    libc = ctypes.CDLL(None, use_errno=True)
    counting = libc.mount(b"proc", b"/proc", b"proc", 0, None) == 0  # this namespace's own processes
    program = os.fork()
    if program == 0:
        run_program(job, settings, results, isolation)
        os._exit(0)
    code = None
    while code is None:
        pid, status = os.waitpid(-1, os.WNOHANG)
        while pid:  # reap every process that ends: orphans come to PID 1
            if pid == program:
                code = os.waitstatus_to_exitcode(status)
            pid, status = os.waitpid(-1, os.WNOHANG) if code is None else (0, 0)
        if code is None and counting and processes() > settings["max_processes"]:
            kill_all()
            report(results, 0, job, f"it ran more than {settings['max_processes']} processes", isolation)
            code = -signal.SIGKILL
        if code is None:
            time.sleep(WATCH_INTERVAL_S)
    kill_all()  # what the program left running
    return 128 - code if code < 0 else code  # a signal as a shell reports it


def kill_all() -> None:
    """From PID 1: every other process of the namespace."""
    with contextlib.suppress(ProcessLookupError):  # there was none
        os.kill(-1, signal.SIGKILL)


def processes() -> int:
    return sum(name.isdigit() for name in os.listdir("/proc"))


def run_program(job: dict, settings: dict, results, isolation: dict) -> None:
    if isolation["processes"]:
        # The capabilities this process holds in the sandbox's user namespace could undo its read-only mounts: the
        # program gets them in a nested namespace instead, which owns none of the sandbox's mounts and networks.
        enter_user_namespace(ctypes.CDLL(None, use_errno=True))
    os.chdir(settings["work"])
    limit(settings, isolation)
    if not isolation["processes"] or not isolation["network"] or not isolation["filesystem"]:
        guard(settings["work"], isolation)
    for fd, name in ((1, "stdout"), (2, "stderr")):  # capped by RLIMIT_FSIZE, removed with the folder
        os.dup2(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
    namespace = {"__name__": "__main__"}
    passed, error = 0, None
    try:
        exec(compile(job["code"], "solution.py", "exec"), namespace)
    except BaseException as failure:  # SystemExit too: the tests have not run
        error = f"the program raised {describe(failure)}"
    if error is None:
        for index, test in enumerate(job["tests"]):
            try:
                exec(compile(test, f"test_{index}.py", "exec"), namespace)
                passed += 1
            except BaseException as failure:
                error = error or f"test {index} raised {describe(failure)}"
    report(results, passed, job, error, isolation)


def limit(settings: dict, isolation: dict) -> None:
    cpu = math.ceil(settings["timeout_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU at the first, which ends it; SIGKILL after
    limits = {
        resource.RLIMIT_AS: settings["memory_mb"] * 2**20,
        resource.RLIMIT_FSIZE: settings["max_output_bytes"],
        resource.RLIMIT_CORE: 0,
    }
    if isolation["processes"]:  # in its own user namespace, RLIMIT_NPROC counts the sandbox's processes alone
        limits[resource.RLIMIT_NPROC] = settings["max_processes"]  # Linux exempts root: the watchdog counts too
    for name, value in limits.items():
        resource.setrlimit(name, (value, value))


def guard(work: str, isolation: dict) -> None:
    """The fallback, in the program's interpreter: refuse what the namespaces would have stopped."""
    work = os.path.realpath(work)
    refused_processes = {
        "os.fork",
        "os.forkpty",
        "os.exec",
        "os.posix_spawn",
        "os.spawn",
        "os.system",
        "subprocess.Popen",
        "pty.spawn",
    }
    refused_network = {"socket.__new__", "socket.getaddrinfo", "socket.connect", "socket.bind", "socket.sendto"}

    def hook(event: str, arguments: tuple) -> None:
        if event == "ctypes.dlopen" or (event in refused_processes and not isolation["processes"]):
            raise PermissionError(f"the sandbox refuses {event}")
        if event in refused_network and not isolation["network"]:
            raise PermissionError(f"the sandbox refuses network access ({event})")
        if event == "open" and not isolation["filesystem"] and _writes(arguments):
            path = arguments[0]
            if isinstance(path, (str, bytes)) and not _inside(os.path.realpath(os.fsdecode(path)), work):
                raise PermissionError(f"the sandbox refuses writing outside its folder: {os.fsdecode(path)}")

    sys.addaudithook(hook)


def _writes(arguments: tuple) -> bool:
    _, mode, flags = arguments
    if isinstance(mode, str):
        return any(letter in mode for letter in "wax+")
    return bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC))


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder + os.sep) or path == os.devnull


def describe(failure: BaseException) -> str:
    message = str(failure)
    return type(failure).__name__ + (f": {message[:200]}" if message else "")


def report(results, passed: int, job: dict, error: str | None, isolation: dict) -> None:
    results.write(json.dumps({"passed": passed, "total": len(job["tests"]), "error": error, "isolation": isolation}))
    results.flush()


if __name__ == "__main__":
    main()
