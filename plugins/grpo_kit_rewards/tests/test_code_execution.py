"""The code_execution reward: right and wrong solutions, and programs that misbehave, each scored and contained.

Every program here runs under small limits (1 s, 256 MiB, 16 processes) so that each test takes about a second at
most; the calling process must survive all of them, and nothing a program writes outside its folder may land.
"""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_kit import RewardError
from grpo_kit_rewards.code_execution import code_of
from grpo_kit_rewards.sandbox import Limits, run_sandboxed

TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"]
SMALL = {"timeout_s": 1.0, "memory_mb": 256, "max_output_bytes": 100_000, "max_processes": 16}
ISOLATIONS = ["auto", "fallback"]


@pytest.fixture(scope="module")
def reward(request):
    from grpo_kit.plugins.registry import Registry, plugin_manager

    return Registry(plugin_manager()).build("reward", "code_execution", SMALL | {"workers": 2})


def run(code: str, isolation: str, tests=("assert True",)):
    return run_sandboxed(code, list(tests), Limits(**SMALL, isolation=isolation))


def test_a_right_and_a_wrong_solution(reward):
    right = "Here it is:\n```python\ndef add(a, b):\n    return a + b\n```"
    wrong = "```python\ndef add(a, b):\n    return a - b\n```"
    scores = reward(["q"] * 3, [right, wrong, "def add(a, b): return a + b"], [[1]] * 3, tests=[TESTS] * 3)
    assert scores == [1.0, 0.0, 1.0]


def test_partial_credit_is_the_fraction_of_tests_passed(registry):
    partial = registry.build("reward", "code_execution", SMALL | {"partial_credit": True})
    assert partial(["q"], ["def add(a, b): return 3"], [[1]], tests=[TESTS]) == [0.5]


def test_the_last_python_block_is_the_code():
    assert code_of("```py\nx = 1\n```\ntext\n```python\nx = 2\n```") == "x = 2\n"
    assert code_of("```\nx = 1\n```") == "```\nx = 1\n```"  # no python block: the whole completion


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_an_infinite_loop_is_killed(isolation):
    outcome = run("while True:\n    pass", isolation)
    assert outcome.passed == 0  # by the CPU limit, or the wall clock when the machine is busy
    assert "CPU time ran out" in outcome.error or "timed out" in outcome.error


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_fork_bomb_is_stopped_and_leaves_nothing_behind(isolation):
    outcome = run("import os\nwhile True:\n    os.fork()", isolation)
    assert outcome.passed == 0
    # Namespaces: the watchdog kills them all past max_processes; the fallback refuses the fork itself.
    assert "more than 16 processes" in outcome.error or "refuses os.fork" in outcome.error
    alive = subprocess.run(["pgrep", "-f", "sandbox_child.py"], capture_output=True, text=True).stdout.split()
    assert alive == []


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_memory_hog_fails_within_its_limit(isolation):
    outcome = run("hog = bytearray(2**30)", isolation)
    assert outcome.passed == 0 and "MemoryError" in outcome.error


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_write_outside_its_folder_does_not_land(isolation, tmp_path):
    targets = [tmp_path / "escaped", Path.home() / f".grpo_kit_sandbox_escape_{os.getpid()}"]
    code = "\n".join(f"open({str(path)!r}, 'w').write('x')" for path in targets)
    outcome = run(code, isolation)
    assert outcome.passed == 0 and not any(path.exists() for path in targets)
    inside = run("open('kept', 'w').write('x')\nimport os\nassert os.path.exists('kept')", isolation)
    assert inside.passed == 1  # its own folder is writable


UNDO_READ_ONLY = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
class MountAttr(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in ("attr_set", "attr_clr", "propagation", "userns_fd")]
writable = MountAttr(attr_clr=1)  # MOUNT_ATTR_RDONLY, on the root mount alone: mount_setattr(2)
libc.syscall(442, -100, b"/", 0, ctypes.byref(writable), ctypes.sizeof(writable))
libc.mount(b"none", b"/", None, 0x20 | 0x1000, None)  # MS_REMOUNT | MS_BIND, read-write
open({target!r}, "w").write("x")
"""


def test_a_program_cannot_undo_the_read_only_view(reward, tmp_path):
    """The sandbox's own user namespace could make the view writable again: the program runs in a nested one."""
    if not reward.isolation["filesystem"]:
        pytest.skip("no read-only view on this machine")
    target = tmp_path / "escaped"
    outcome = run(UNDO_READ_ONLY.format(target=str(target)), "namespaces")
    assert outcome.passed == 0 and "Read-only file system" in outcome.error and not target.exists()


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_socket_cannot_reach_out(isolation):
    with socket.socket() as server:  # a listener on this machine's loopback, which the sandbox must not reach
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        outcome = run(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=0.5)", isolation)
    assert outcome.passed == 0 and outcome.error.startswith("the program raised")


def test_output_is_capped():
    outcome = run("print('x' * 1_000_000)", "auto")
    assert outcome.passed == 0 and "File too large" in outcome.error


def test_the_folder_is_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    assert run("open('left', 'w').write('x')", "auto").passed == 1
    assert list(tmp_path.iterdir()) == []


def test_namespaces_are_what_auto_uses_here(reward):
    """This machine allows unprivileged namespaces; where one does not, auto falls back (and warns)."""
    if sys.platform != "linux":
        pytest.skip("namespaces are Linux's")
    assert reward.isolation == {"network": True, "filesystem": True, "processes": True}


def test_tests_of_the_wrong_type_stop_the_run(reward):
    with pytest.raises(RewardError, match="python source"):
        reward(["q"], ["x = 1"], [[1]], tests=[3])
