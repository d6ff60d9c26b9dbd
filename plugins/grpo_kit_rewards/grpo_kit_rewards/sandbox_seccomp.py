"""A seccomp filter for the sandboxed program: no socket of any family, and no way around the sandbox's namespaces.

Installed in the program's process just before it executes the interpreter (sandbox_namespaces.py); it holds for
every process and thread that follows and cannot be removed. It denies, with EPERM:

- creating a socket (`socket`, for every family), and `connect`, `bind`, `listen`, `accept`: a path-bound unix
  socket is reachable from any network namespace, so no namespace alone keeps the program from one. `socketpair`
  stays allowed for a connected AF_UNIX stream pair only (asyncio's self-pipe, multiprocessing's Pipe): it reaches
  nothing but itself, and a stream socket cannot send to an address;
- io_uring, which performs socket and file operations without these system calls;
- reaching another process's memory or files (`ptrace`, `process_vm_readv`/`writev`, `pidfd_getfd`);
- new namespaces and mounts (`unshare`, `setns`, `clone` with a namespace flag, `mount` and the new mount API,
  `pivot_root`, `chroot`): a namespace of its own would give the program a writable tmpfs outside its disk limit;
- memory that no limit of the program's counts: SysV shared memory (`shmget`: a segment outlives its mapping, so
  RLIMIT_AS does not hold it) and `memfd_create` (a file in memory, outside the program's tmpfs);
- kernel interfaces a sandbox never needs (`bpf`, `perf_event_open`, `userfaultfd`, the keyring).

`clone3`, whose flags the filter cannot read (they are in memory), and every system call newer than this table
fail with ENOSYS, to which the C library answers by falling back to the older call. A system call of another ABI
(32-bit x86, x32, 32-bit ARM) kills the process: their numbers differ and this filter does not know them.
"""

import ctypes
import errno
import os
import platform

AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
SYSCALLS = {  # the numbers of Linux's system-call tables (arch/x86/entry/syscalls, include/uapi/asm-generic)
    "x86_64": {
        "shmget": 29,
        "socket": 41,
        "connect": 42,
        "accept": 43,
        "bind": 49,
        "listen": 50,
        "socketpair": 53,
        "clone": 56,
        "ptrace": 101,
        "pivot_root": 155,
        "chroot": 161,
        "mount": 165,
        "umount2": 166,
        "add_key": 248,
        "request_key": 249,
        "keyctl": 250,
        "unshare": 272,
        "accept4": 288,
        "perf_event_open": 298,
        "setns": 308,
        "process_vm_readv": 310,
        "process_vm_writev": 311,
        "bpf": 321,
        "memfd_create": 319,
        "userfaultfd": 323,
    },
    "aarch64": {
        "umount2": 39,
        "mount": 40,
        "pivot_root": 41,
        "chroot": 51,
        "unshare": 97,
        "ptrace": 117,
        "socket": 198,
        "socketpair": 199,
        "bind": 200,
        "listen": 201,
        "accept": 202,
        "connect": 203,
        "shmget": 194,
        "add_key": 217,
        "request_key": 218,
        "keyctl": 219,
        "clone": 220,
        "perf_event_open": 241,
        "accept4": 242,
        "setns": 268,
        "process_vm_readv": 270,
        "process_vm_writev": 271,
        "bpf": 280,
        "memfd_create": 279,
        "userfaultfd": 282,
    },
}
COMMON = {  # numbered alike on every architecture since Linux 5.1
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "clone3": 435,
    "pidfd_getfd": 438,
    "mount_setattr": 442,
    "open_tree_attr": 467,
}
NEWEST = 469  # file_setattr, Linux 6.17: the last number this table knows
X32_BIT = 0x40000000  # x86_64's x32 ABI: the same numbers with this bit set
DENIED = (
    "socket connect bind listen accept accept4 io_uring_setup io_uring_enter io_uring_register ptrace "
    "process_vm_readv process_vm_writev pidfd_getfd unshare setns mount umount2 pivot_root chroot mount_setattr "
    "open_tree open_tree_attr move_mount fsopen fsconfig fsmount fspick bpf perf_event_open userfaultfd keyctl "
    "add_key request_key shmget memfd_create"
).split()
CLONE_NAMESPACES = 0x7E020000  # CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET
AF_UNIX, SOCK_STREAM, SOCK_TYPE_MASK = 1, 1, 0xF

# Classic BPF, as seccomp runs it on struct seccomp_data {int nr; u32 arch; u64 ip; u64 args[6]}.
LOAD, AND, JEQ, JGT, JSET, RET = 0x20, 0x54, 0x15, 0x25, 0x45, 0x06
NR, ARCH, ARG0, ARG1 = 0, 4, 16, 24  # offsets; an argument's low 32 bits (little-endian), all these calls read
ALLOW, KILL_PROCESS, ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2


class Instruction(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Instruction))]


def program(machine: str) -> list[tuple[int, int, int, int]]:
    """The filter for `machine` (platform.machine()), as (code, jump if true, jump if false, k) instructions."""
    if machine not in AUDIT_ARCH:
        raise OSError(
            errno.ENOSYS, f"the sandbox's seccomp filter knows x86_64 and aarch64, not this machine's {machine}"
        )
    numbers = SYSCALLS[machine] | COMMON
    deny = (RET, 0, 0, ERRNO | errno.EPERM)
    instructions = [(LOAD, 0, 0, ARCH), (JEQ, 1, 0, AUDIT_ARCH[machine]), (RET, 0, 0, KILL_PROCESS), (LOAD, 0, 0, NR)]
    if machine == "x86_64":
        instructions += [(JSET, 0, 1, X32_BIT), (RET, 0, 0, KILL_PROCESS)]
    instructions += [(JGT, 0, 1, NEWEST), (RET, 0, 0, ERRNO | errno.ENOSYS)]
    instructions += [(JEQ, 0, 1, numbers["clone3"]), (RET, 0, 0, ERRNO | errno.ENOSYS)]
    for name in DENIED:
        instructions += [(JEQ, 0, 1, numbers[name]), deny]
    instructions += [  # clone: threads and processes, but no new namespace
        (JEQ, 0, 4, numbers["clone"]),
        (LOAD, 0, 0, ARG0),
        (JSET, 0, 1, CLONE_NAMESPACES),
        deny,
        (RET, 0, 0, ALLOW),
    ]
    instructions += [  # socketpair: a connected AF_UNIX stream pair alone
        (JEQ, 0, 6, numbers["socketpair"]),
        (LOAD, 0, 0, ARG0),
        (JEQ, 0, 3, AF_UNIX),
        (LOAD, 0, 0, ARG1),
        (AND, 0, 0, SOCK_TYPE_MASK),
        (JEQ, 1, 0, SOCK_STREAM),
        deny,
    ]
    return instructions + [(RET, 0, 0, ALLOW)]


def install() -> None:
    """Confine this process and everything it starts from now on (raises OSError where the kernel refuses)."""
    instructions = program(platform.machine())
    filters = (Instruction * len(instructions))(*(Instruction(*instruction) for instruction in instructions))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
    # Without no_new_privs, an unprivileged process may not install a filter (and a set-user-ID program could
    # otherwise run confined by it): the same for every user, root included.
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, None, 0, 0) != 0:
        _raise(libc, "prctl(PR_SET_NO_NEW_PRIVS)")
    fprog = Program(len(instructions), filters)
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        _raise(libc, "installing the seccomp filter")


def _raise(libc, what: str) -> None:
    number = ctypes.get_errno()
    raise OSError(number, f"{what}: {os.strerror(number)}")
