"""The code_execution reward: right and wrong solutions, programs that misbehave, and the options it refuses.

Every program here runs under small limits (1 s, 256 MiB, 16 processes) so that each test takes about a second at
most. The hostile programs of issue 44 are in test_sandbox_escapes.py and test_sandbox_verdict.py; the seccomp
filter's in test_sandbox_seccomp.py; the non-root user's in test_sandbox_as_a_user.py.
"""

import ctypes
import dataclasses
import fcntl
import logging
import os
import re
import tempfile

import pytest

from grpo_kit import ConfigError, RewardError
from grpo_kit.plugins.inventory import field_help
from grpo_kit_rewards import sandbox_folders
from grpo_kit_rewards.code_execution import code_of
from grpo_kit_rewards.configs import CodeExecutionConfig
from grpo_kit_rewards.sandbox import ISOLATION, Limits, run_sandboxed

TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"]
SMALL = {"timeout_s": 1.0, "memory_mb": 256, "max_output_bytes": 100_000, "max_processes": 16}
ISOLATIONS = ["sandbox", "unsafe_unconfined"]


@pytest.fixture(scope="module")
def reward():
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


def test_a_fork_bomb_is_stopped_and_leaves_nothing_behind():
    outcome = run("import os\nwhile True:\n    os.fork()", "sandbox")
    assert outcome.passed == 0 and "Resource temporarily unavailable" in outcome.error  # RLIMIT_NPROC's EAGAIN
    runners = [pid for pid in os.listdir("/proc") if pid.isdigit() and _runs_a_sandbox(pid)]
    assert runners == []


def _runs_a_sandbox(pid: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return b"REQUESTS_FD, RESPONSES_FD = 3, 4" in cmdline.read()  # sandbox_program.py's source, its argument
    except OSError:
        return False


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_memory_hog_fails_within_its_limit(isolation):
    outcome = run("hog = bytearray(2**30)", isolation)
    assert outcome.passed == 0 and "MemoryError" in outcome.error


def test_a_write_outside_its_folder_does_not_land(tmp_path):
    targets = [tmp_path / "escaped", os.path.expanduser(f"~/.grpo_kit_sandbox_escape_{os.getpid()}")]
    code = "\n".join(f"open({str(path)!r}, 'w').write('x')" for path in targets)
    outcome = run(code, "sandbox")
    assert outcome.passed == 0 and not any(os.path.exists(path) for path in targets)
    inside = run("open('kept', 'w').write('x')", "sandbox", ["assert True"])
    assert inside.passed == 1  # its own folder is writable


UNDO_READ_ONLY = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
class MountAttr(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in ("attr_set", "attr_clr", "propagation", "userns_fd")]
target = os.path.join(os.path.dirname(os.__file__), "escaped")  # the standard library: a folder of the host's
writable = MountAttr(attr_clr=1)  # MOUNT_ATTR_RDONLY: mount_setattr(2), then a read-write remount
undone = [libc.syscall(442, -100, os.path.dirname(target).encode(), 0, ctypes.byref(writable), 32)]
undone.append(libc.mount(b"none", os.path.dirname(target).encode(), None, 0x20 | 0x1000, None))
open(target, "w").write("x")
"""


def test_a_program_cannot_make_the_hosts_folders_writable():
    target = os.path.join(os.path.dirname(os.__file__), "escaped")
    outcome = run(UNDO_READ_ONLY, "sandbox")
    assert outcome.passed == 0 and "Read-only file system" in outcome.error and not os.path.exists(target)


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_output_is_capped(isolation):
    outcome = run("print('x' * 1_000_000)", isolation)
    assert outcome.passed == 0 and ("File too large" in outcome.error or "No space left" in outcome.error)


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_no_folder_is_left_on_the_trainers_disk(isolation, tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    assert run("open('left', 'w').write('x')", isolation).passed == 1
    assert list(tmp_path.iterdir()) == []


LOCKED_AND_DEEP = """
import os
os.makedirs("locked/inner")
open("locked/inner/file", "w").write("x")
os.chmod("locked/inner", 0)
os.chmod("locked", 0)
for _ in range(3000):  # deeper than any recursion, and than PATH_MAX as one path
    os.mkdir("d")
    os.chdir("d")
"""


def test_an_unconfined_folder_is_removed_whatever_the_program_did(tmp_path, monkeypatch):
    """Modes taken away, and a tree deeper than shutil.rmtree's recursion, which left it in place silently."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    outcome = run(LOCKED_AND_DEEP, "unsafe_unconfined")
    assert outcome.passed == 1, outcome.error
    assert list(tmp_path.iterdir()) == []


def test_folders_that_killed_runs_left_are_swept_at_the_next_start(tmp_path):
    left = tmp_path / f"{sandbox_folders.PREFIX}left"
    (left / "inner").mkdir(parents=True)
    (left / "inner" / "file").write_text("x")
    (left / "inner").chmod(0)
    in_use = tmp_path / f"{sandbox_folders.PREFIX}in-use"  # another run's program, running now
    in_use.mkdir()
    other = tmp_path / "someone-elses"
    other.mkdir()
    lock = os.open(in_use, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        assert sandbox_folders.sweep(str(tmp_path)) == 1
    finally:
        os.close(lock)
    assert sorted(path.name for path in tmp_path.iterdir()) == [in_use.name, other.name]


def test_the_sandbox_is_what_runs_here(reward):
    """This machine can build the sandbox (as CI's can): the reward started without refusing."""
    assert reward.limits.isolation == "sandbox"


def test_tests_of_the_wrong_type_stop_the_run(reward):
    with pytest.raises(RewardError, match="python source"):
        reward(["q"], ["x = 1"], [[1]], tests=[3])


# Item 2: the sandbox or nothing, unless the user says the code is trusted.


@pytest.mark.parametrize("isolation", ["auto", "fallback", "namespaces", "required"])
def test_an_isolation_that_is_not_one_is_refused(registry, isolation):
    with pytest.raises(ConfigError, match="is not one of: sandbox, unsafe_unconfined"):
        registry.build("reward", "code_execution", SMALL | {"isolation": isolation})


CLONE_NEWUSER = 0x10000000


def test_a_machine_without_user_namespaces_is_refused_with_what_to_do(registry):
    """Where Linux refuses the sandbox's namespaces, the run stops before training: no silent fallback."""
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # a user namespace of our own, in which no further one may be made
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            assert libc.unshare(CLONE_NEWUSER) == 0, os.strerror(ctypes.get_errno())
            for name, text in (("setgroups", "deny"), ("uid_map", "0 0 1"), ("gid_map", "0 0 1")):
                with open(f"/proc/self/{name}", "w") as file:
                    file.write(text)
            with open("/proc/sys/user/max_user_namespaces", "w") as file:
                file.write("0")
            registry.build("reward", "code_execution", SMALL)
            message = "built"
        except BaseException as error:  # the refusal, or what went wrong instead
            message = f"{type(error).__name__}: {error}"
        os.write(write_end, message.encode())
        os._exit(0)
    os.close(write_end)
    os.waitpid(child, 0)
    with os.fdopen(read_end, "rb") as pipe:
        message = pipe.read().decode()
    assert message.startswith("ConfigError: reward.code_execution cannot sandbox programs here"), message
    assert "unshare" in message and "user namespaces" in message and "isolation=unsafe_unconfined" in message


def test_unconfined_says_so_at_the_start(registry, caplog):
    with caplog.at_level(logging.WARNING):
        unconfined = registry.build("reward", "code_execution", SMALL | {"isolation": "unsafe_unconfined"})
    assert unconfined(["q"], ["def add(a, b): return a + b"], [[1]], tests=[TESTS]) == [1.0]
    assert "programs run without a sandbox" in caplog.text and "trust" in caplog.text


def test_a_row_the_sandbox_could_not_be_built_for_scores_none(reward, caplog):
    from grpo_kit_rewards.sandbox import Outcome

    with caplog.at_level(logging.WARNING):
        assert reward.score(Outcome(0, 2, "unshare: Operation not permitted", sandboxed=False)) is None
    assert "could not be set up" in caplog.text


# Item 5: the options.


def test_a_timeout_that_does_not_fit_the_batchs_is_refused(registry):
    with pytest.raises(ConfigError, match=r"timeout_s=90 .* does not fit trainer.reward_timeout=60"):
        registry.build("reward", "code_execution", SMALL | {"timeout_s": 90.0, "reward_timeout": 60.0})


def test_a_batch_that_may_not_fit_is_warned_about(registry, caplog):
    slow = registry.build("reward", "code_execution", SMALL | {"workers": 1, "reward_timeout": 5.0})
    with caplog.at_level(logging.WARNING):
        slow(["q"] * 2, ["x = 1"] * 2, [[1]] * 2, tests=[["assert x == 1"]] * 2)
    assert "may take up to 6 s, more than trainer.reward_timeout=5" in caplog.text


def test_the_isolation_options_help_lists_exactly_the_accepted_values():
    field = next(field for field in dataclasses.fields(CodeExecutionConfig) if field.name == "isolation")
    assert sorted(set(re.findall(r'"(\w+)"', field_help(CodeExecutionConfig, field)))) == sorted(ISOLATION)
