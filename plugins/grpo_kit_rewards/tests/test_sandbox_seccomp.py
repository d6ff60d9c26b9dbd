"""The seccomp filter: its decisions on both architectures, and the kernel enforcing it on this machine's.

The filter is classic BPF, which this test evaluates itself for x86_64 and aarch64 alike (no aarch64 kernel is at
hand); the sandboxed programs below then make the same system calls for real, with ctypes, under this kernel.
"""

import errno
import platform
import struct

import pytest

from grpo_kit_rewards import sandbox_seccomp
from grpo_kit_rewards.sandbox import Limits, run_sandboxed
from grpo_kit_rewards.sandbox_seccomp import ALLOW, AUDIT_ARCH, ERRNO, KILL_PROCESS, SYSCALLS, program

CLONE_NEWUSER, SIGCHLD, SOCK_CLOEXEC, AF_INET, SOCK_DGRAM = 0x10000000, 17, 0x80000, 2, 2


def decide(instructions, machine: str, number: int, *args: int, arch: int | None = None) -> int:
    """What the kernel would do with this system call: classic BPF run on a struct seccomp_data."""
    arch = AUDIT_ARCH[machine] if arch is None else arch
    data = struct.pack("<iIQ6Q", number, arch, 0, *args, *[0] * (6 - len(args)))
    accumulator, pc = 0, 0
    while True:
        code, jt, jf, k = instructions[pc]
        pc += 1
        if code == sandbox_seccomp.LOAD:
            (accumulator,) = struct.unpack_from("<I", data, k)
        elif code == sandbox_seccomp.AND:
            accumulator &= k
        elif code == sandbox_seccomp.RET:
            return k
        else:
            taken = {
                sandbox_seccomp.JEQ: accumulator == k,
                sandbox_seccomp.JGT: accumulator > k,
                sandbox_seccomp.JSET: bool(accumulator & k),
            }[code]
            pc += jt if taken else jf


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_the_filter_denies_sockets_namespaces_and_unknown_calls(machine):
    instructions = program(machine)
    numbers = SYSCALLS[machine] | sandbox_seccomp.COMMON
    deny, unknown = ERRNO | errno.EPERM, ERRNO | errno.ENOSYS
    for name in ("socket", "connect", "bind", "io_uring_setup", "ptrace", "unshare", "mount", "shmget", "memfd_create"):
        assert decide(instructions, machine, numbers[name], AF_INET) == deny, name
    assert decide(instructions, machine, numbers["socketpair"], 1, 1 | SOCK_CLOEXEC) == ALLOW  # asyncio's self-pipe
    assert decide(instructions, machine, numbers["socketpair"], AF_INET, 1) == deny
    assert decide(instructions, machine, numbers["socketpair"], 1, SOCK_DGRAM) == deny  # could send to a path
    assert decide(instructions, machine, numbers["clone"], SIGCHLD) == ALLOW  # fork, threads
    assert decide(instructions, machine, numbers["clone"], CLONE_NEWUSER | SIGCHLD) == deny
    assert decide(instructions, machine, numbers["clone3"]) == unknown  # the C library falls back to clone
    assert decide(instructions, machine, sandbox_seccomp.NEWEST + 1) == unknown
    assert decide(instructions, machine, 63) == ALLOW  # read (aarch64) / uname (x86_64)
    assert decide(instructions, machine, 0, arch=0x40000003) == KILL_PROCESS  # 32-bit x86's numbers differ


def test_x32_calls_are_killed():
    assert decide(program("x86_64"), "x86_64", 41 | sandbox_seccomp.X32_BIT, AF_INET) == KILL_PROCESS


def test_another_machine_is_refused_by_name():
    with pytest.raises(OSError, match="knows x86_64 and aarch64, not this machine's riscv64"):
        program("riscv64")


RAW_CALLS = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
def call(number, *args):
    return libc.syscall(number, *args), ctypes.get_errno()
results = {{name: call(number, *args) for name, (number, args) in {calls!r}.items()}}
"""


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the raw numbers below are x86_64's")
def test_the_kernel_enforces_it_on_raw_system_calls():
    calls = {
        "socket": (41, (AF_INET, 1, 0)),
        "socket_unix": (41, (1, 1, 0)),
        "io_uring_setup": (425, (8, 0)),
        "unshare": (272, (CLONE_NEWUSER,)),
        "ptrace_attach_init": (101, (16, 1, 0, 0)),
        "clone3": (435, (0, 0)),
    }
    tests = [f"assert results[{name!r}] == (-1, {errno.EPERM})" for name in calls if name != "clone3"]
    tests.append(f"assert results['clone3'] == (-1, {errno.ENOSYS})")
    outcome = run_sandboxed(RAW_CALLS.format(calls=calls), tests, Limits(timeout_s=3.0, memory_mb=256))
    assert outcome.passed == len(tests), outcome.error


@pytest.mark.skipif(platform.machine() != "x86_64", reason="x32 and int 0x80 are x86_64's")
@pytest.mark.parametrize(
    "code",
    [
        "import ctypes\nctypes.CDLL(None).syscall(41 | 0x40000000, 2, 1, 0)",  # socket through the x32 ABI
        # socketcall(SYS_SOCKET) through the 32-bit ABI, from machine code: mov eax, 102; mov ebx, 1; int 0x80; ret
        "import ctypes, mmap\n"
        "code = bytes.fromhex('b866000000bb01000000cd80c3')\n"
        "memory = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n"
        "memory.write(code)\n"
        "address = ctypes.addressof(ctypes.c_char.from_buffer(memory))\n"
        "ctypes.CFUNCTYPE(ctypes.c_int)(address)()",
    ],
    ids=["x32", "int-0x80"],
)
def test_another_abi_kills_the_program(code):
    outcome = run_sandboxed(code, ["assert True"], Limits(timeout_s=3.0, memory_mb=256))
    assert outcome.passed == 0 and "killed by SIGSYS" in outcome.error
