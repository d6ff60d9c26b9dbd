"""The sandbox's namespaces and the minimal filesystem the program sees (run in a process forked by the grader).

Two steps, so that the program's user namespace owns none of the mounts it could otherwise undo:

1. A mount namespace (in a user namespace of its own when not run by root), where a new root is built on a small
   tmpfs: read-only binds of the interpreter, its ELF loader, its standard library, the folders of the shared
   libraries it maps, /etc/ld.so.cache and the devices null, zero, full, random and urandom; and the program's
   folder /work, a tmpfs of `max_output_bytes` (the bound on all it writes). pivot_root makes it the whole tree:
   no /proc, /sys, /tmp, /home or /run, so no socket file, no other process and no secret is there to see.
2. New user, network, PID, IPC and UTS namespaces. Root maps the program to the unprivileged user and group 65534
   (nobody), which holds no capability outside, no supplementary group, and no exemption from RLIMIT_NPROC: the
   grader writes that mapping, since only a process outside a namespace may map another user into it. Any other
   user stays itself, mapped by this process. Then this process starts the namespace's first process (`init`),
   which starts the program and reaps.
"""

import ctypes
import os
import platform
import signal
import struct
import sys

from grpo_kit_rewards.sandbox_program import REQUESTS_FD, RESPONSES_FD, receive, send
from grpo_kit_rewards.sandbox_seccomp import SYSCALLS

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 0x1, 0x2, 0x4, 0x8, 0x20
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC, MS_PRIVATE, MS_RELATIME = 0x400, 0x800, 0x1000, 0x4000, 0x40000, 0x200000
MNT_DETACH, PR_SET_PDEATHSIG = 2, 1
# A bind's flags that a user namespace may not clear (they stay locked from the mount it binds): kept on remount.
KEPT = {
    os.ST_NOSUID: MS_NOSUID,
    os.ST_NODEV: MS_NODEV,
    os.ST_NOEXEC: MS_NOEXEC,
    os.ST_NOATIME: MS_NOATIME,
    os.ST_NODIRATIME: MS_NODIRATIME,
    os.ST_RELATIME: MS_RELATIME,
}
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
BUILD_AT = "/tmp"  # where the new root is assembled, in this mount namespace only; pivot_root then hides the rest
WORK = "/work"
NOBODY = 65534


def exposed_paths() -> list[str]:
    """What the program's interpreter needs to start and import its standard library (with its C extensions)."""
    interpreter = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    paths = [interpreter, os.path.dirname(os.path.realpath(os.__file__))]
    loader = elf_interpreter(interpreter)
    if loader:
        paths.append(loader)
    with open("/proc/self/maps") as maps:
        mapped = {line.split(None, 5)[5].strip() for line in maps if len(line.split(None, 5)) == 6}
    for path in sorted(mapped):
        if path.startswith("/") and os.path.exists(path):  # not [heap], [stack], "(deleted)"
            paths.append(os.path.dirname(path) if ".so" in os.path.basename(path) else path)
    return paths + [path for path in ("/etc/ld.so.cache",) if os.path.exists(path)]


def elf_interpreter(path: str) -> str | None:
    """The ELF loader named in a 64-bit executable's PT_INTERP (None: static, or not 64-bit ELF)."""
    with open(path, "rb") as executable:
        header = executable.read(64)
        if header[:4] != b"\x7fELF" or header[4] != 2:
            return None
        order = "<" if header[5] == 1 else ">"
        (table,) = struct.unpack_from(order + "Q", header, 0x20)
        size, count = struct.unpack_from(order + "HH", header, 0x36)
        for index in range(count):
            executable.seek(table + index * size)
            entry = executable.read(size)
            if struct.unpack_from(order + "I", entry)[0] == 3:  # PT_INTERP
                (offset,), (length,) = (
                    struct.unpack_from(order + "Q", entry, 8),
                    struct.unpack_from(order + "Q", entry, 32),
                )
                executable.seek(offset)
                return executable.read(length).rstrip(b"\0").decode()
    return None


def map_to_nobody(pid: int) -> None:
    """From the grader, root, outside: the program's user namespace maps its root to nobody."""
    _write(f"/proc/{pid}/uid_map", f"0 {NOBODY} 1")
    _write(f"/proc/{pid}/gid_map", f"0 {NOBODY} 1")


def confine(exposed: list[str], disk_bytes: int, start_program) -> None:
    """In the forked process: build the root, enter the namespaces, run `start_program` as the namespace's second
    process under an `init` that reaps; exits with the program's status. Raises OSError naming the step refused."""
    libc = ctypes.CDLL(None, use_errno=True)
    root = os.geteuid() == 0
    # This process's /proc folder, kept for its second mapping: after pivot_root there is no /proc to open it from.
    proc = os.open(f"/proc/{os.getpid()}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    if root:
        _call(libc, libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    else:  # mounts need a user namespace of their own
        _call(libc, libc.unshare(CLONE_NEWUSER | CLONE_NEWNS), "unshare(CLONE_NEWUSER | CLONE_NEWNS)")
        map_self(proc, os.geteuid(), os.getegid())
    _mount(libc, None, "/", None, MS_REC | MS_PRIVATE, "making every mount private")
    build_root(libc, plan(exposed), disk_bytes, root)
    _call(libc, libc.syscall(SYSCALLS[platform.machine()]["pivot_root"], b".", b"."), "pivot_root")
    _call(libc, libc.umount2(b".", MNT_DETACH), "detaching the old root")
    os.chdir("/")
    namespaces = CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
    _call(libc, libc.unshare(namespaces), "unshare(CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWPID | ...)")
    if root:
        send(RESPONSES_FD, {"map_ids": True})
        if receive(REQUESTS_FD, 64) != {"go": True}:
            raise OSError("the grader did not map the sandbox's user")
        os.setgroups([])
    else:
        map_self(proc, 0, 0)  # this user, who is 0 in the first namespace
    os.close(proc)
    os.setresgid(0, 0, 0)
    os.setresuid(0, 0, 0)  # root: now nobody outside, with every capability inside alone
    _call(libc, libc.sethostname(b"sandbox", 7), "naming the host")  # its UTS namespace starts with the host's name
    die_with_parent(libc)  # a change of user clears the parent-death signal
    init = os.fork()
    if init == 0:
        os._exit(run_init(libc, start_program))
    os._exit(os.waitstatus_to_exitcode(os.waitpid(init, 0)[1]) & 0xFF)  # init's, which is the program's


def map_self(proc: int, uid: int, gid: int) -> None:
    """Maps this process's user and group (as its parent namespace numbers them) to 0 in its new namespace; `proc`
    is this process's /proc folder."""
    _write("setgroups", "deny", proc)  # an unprivileged group mapping needs setgroups refused first
    _write("uid_map", f"0 {uid} 1", proc)
    _write("gid_map", f"0 {gid} 1", proc)


def plan(exposed: list[str]) -> list[tuple]:
    """The steps that rebuild `exposed` (and the devices) at the same paths, symbolic links included, as
    ("link", path, target), ("bind", path, fd, is_folder, flags); each file opened now, before BUILD_AT is covered."""
    steps, bound = [], []
    for path in sorted(set(exposed), key=len) + list(DEVICES):
        _plan_path(os.path.normpath(path), steps, bound, depth=0)
    return steps


def _plan_path(path: str, steps: list, bound: list, depth: int) -> None:
    if depth > 16:
        raise OSError(f"too many symbolic links to expose {path}")
    parts = path.strip("/").split("/")
    current = "/"
    for index, part in enumerate(parts):
        current = os.path.join(current, part)
        if any(current == folder or current.startswith(folder + "/") for folder in bound):
            return  # inside a folder that is exposed whole
        if os.path.islink(current):
            target = os.readlink(current)
            if ("link", current, target) not in steps:
                steps.append(("link", current, target))
            resolved = os.path.join(os.path.dirname(current), target, *parts[index + 1 :])
            return _plan_path(os.path.normpath(resolved), steps, bound, depth + 1)
    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    folder = os.path.isdir(path)
    flags = sum(flag for st_flag, flag in KEPT.items() if os.statvfs(path).f_flag & st_flag)
    steps.append(("bind", path, fd, folder, flags | (0 if path in DEVICES else MS_NOSUID | MS_NODEV)))
    if folder:
        bound.append(path)


def build_root(libc, steps: list, disk_bytes: int, root: bool) -> None:
    _mount(libc, "tmpfs", BUILD_AT, "tmpfs", MS_NOSUID | MS_NODEV, "tmpfs for the root", "size=1m,mode=0755")
    for step in steps:
        target = BUILD_AT + step[1]
        os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
        if step[0] == "link":
            os.symlink(step[2], target)
            continue
        _, path, fd, folder, flags = step
        if folder:
            os.makedirs(target, mode=0o755, exist_ok=True)
        else:
            os.close(os.open(target, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644))
        _mount(libc, f"/proc/self/fd/{fd}", target, None, MS_BIND, f"binding {path}")
        os.close(fd)
        _mount(libc, None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags, f"making {path} read-only")
    os.mkdir(BUILD_AT + WORK, 0o700)
    owner = f",uid={NOBODY},gid={NOBODY}" if root else ""
    options = f"size={disk_bytes},nr_inodes=4096,mode=0700{owner}"
    _mount(libc, "tmpfs", BUILD_AT + WORK, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "the program's folder", options)
    _mount(libc, None, BUILD_AT, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, "a read-only root")
    os.chdir(BUILD_AT)


def run_init(libc, start_program) -> int:
    """PID 1 of the program's namespace: when it ends, Linux kills every process left in the namespace."""
    # Its parent is outside its PID namespace (getppid() says 0), so no check follows: a parent that died before
    # this was armed was killed with its whole process group, this process included.
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    program = os.fork()
    if program == 0:
        start_program()
    while True:
        pid, status = os.wait()  # orphans come to PID 1: reap them all
        if pid == program:
            code = os.waitstatus_to_exitcode(status)
            return 128 - code if code < 0 else code  # a signal as a shell reports it


def die_with_parent(libc) -> None:
    parent = os.getppid()
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # it died before the signal was armed
        os._exit(1)


def _write(path: str, text: str, folder: int | None = None) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC, dir_fd=folder)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _mount(libc, source, target, kind, flags: int, what: str, options: str | None = None) -> None:
    encoded = [value.encode() if value is not None else None for value in (source, target, kind, options)]
    _call(libc, libc.mount(encoded[0], encoded[1], encoded[2], flags, encoded[3]), what)


def _call(libc, result: int, what: str) -> None:
    if result != 0:
        number = ctypes.get_errno()
        raise OSError(number, f"{what}: {os.strerror(number)}")
