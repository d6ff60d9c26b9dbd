"""The sandbox run by a user who is not root (the trainer's usual case), here the user nobody (65534).

As root the sandbox maps the program to nobody and builds its root as root; as any other user it needs an
unprivileged user namespace first, and its clean-up works with that user's permissions alone. These tests run a
trainer as nobody, with a Python that nobody may execute (a checkout's venv often lives where nobody cannot read).
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

NOBODY = 65534
PACKAGE = str(Path(__file__).parents[1])
TRAINER = """
import json, sys
sys.path.insert(0, {package!r})
from grpo_kit_rewards.sandbox import Limits, run_sandboxed
limits = Limits(timeout_s=2.0, memory_mb=1024, max_output_bytes=100_000, max_processes=8, isolation={isolation!r})
outcome = run_sandboxed({code!r}, {tests!r}, limits)
print(json.dumps([outcome.passed, outcome.error]))
"""


@pytest.fixture(scope="module")
def python_for_nobody() -> str:
    if os.geteuid() != 0:
        pytest.skip("only root can run a test process as another user")
    for candidate in (os.path.realpath(sys.executable), "/usr/bin/python3"):
        check = f"import sys; sys.path.insert(0, {PACKAGE!r}); import grpo_kit_rewards.sandbox"
        try:
            ran = subprocess.run([candidate, "-c", check], user=NOBODY, group=NOBODY, extra_groups=[], cwd="/")
        except OSError:
            continue
        if ran.returncode == 0:
            return candidate
    pytest.skip(f"no Python that nobody may run and that can read {PACKAGE}")


@pytest.fixture
def nobodys_temp():
    folder = tempfile.mkdtemp(dir="/tmp", prefix="grpo_kit-test-nobody-")
    os.chown(folder, NOBODY, NOBODY)
    yield folder
    shutil.rmtree(folder)


def as_nobody(python: str, temp: str, code: str, tests: list[str], isolation: str) -> list:
    trainer = TRAINER.format(package=PACKAGE, code=code, tests=tests, isolation=isolation)
    finished = subprocess.run(
        [python, "-c", trainer],
        user=NOBODY,
        group=NOBODY,
        extra_groups=[],
        cwd="/",
        env={"PATH": os.defpath, "TMPDIR": temp},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert finished.returncode == 0, finished.stderr
    return json.loads(finished.stdout)


PROBE = """
import os, socket, threading, time
threading.stack_size(256 * 1024)
try:
    socket.socket(socket.AF_UNIX)
    reached = True
except OSError:
    reached = False
started = 0
try:
    for _ in range(20):
        threading.Thread(target=time.sleep, args=(0.5,)).start()
        started += 1
except RuntimeError:
    pass
top = sorted(os.listdir("/"))
"""


def test_the_sandbox_confines_an_unprivileged_users_program(python_for_nobody, nobodys_temp):
    tests = ["assert not reached", "assert started < 8, started", "assert 'tmp' not in top and 'work' in top", "pass"]
    passed, error = as_nobody(python_for_nobody, nobodys_temp, PROBE, tests, "sandbox")
    assert passed == len(tests), error
    assert os.listdir(nobodys_temp) == []


LOCKED = """
import os
os.makedirs("locked/inner")
open("locked/inner/file", "w").write("x" * 1000)
os.chmod("locked/inner", 0)
os.chmod("locked", 0)
"""


def test_an_unprivileged_users_folder_is_removed_after_it_was_locked(python_for_nobody, nobodys_temp):
    """As root, removal ignores modes; as a user, a folder of mode 000 stopped shutil.rmtree, silently."""
    passed, error = as_nobody(python_for_nobody, nobodys_temp, LOCKED, ["pass"], "unsafe_unconfined")
    assert passed == 1, error
    assert os.listdir(nobodys_temp) == []
