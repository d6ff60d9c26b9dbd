"""The verdict (issue 44, item 3): programs that try to forge their tests' result score 0, and only their own row.

The tests run in the grader's process, outside the program's reach (sandbox_grader.py). Each hostile program here
attacks the grading as the issue found it attacked: it forges the report, ends before the tests, rewrites the
interpreter's exec, AssertionError or trace function, reads the tests from memory, or answers with an object that
claims to equal anything. None of them defines a right `add`, so each must score 0; the last defines one but garbles
the grader's pipe, which scores 0 too. The last tests show that honest programs with classes, generators,
exceptions and the standard library are still graded as before.
"""

import dataclasses

import pytest

from grpo_kit_rewards.sandbox import Limits, Outcome, parse_report, run_sandboxed

SMALL = Limits(timeout_s=2.0, memory_mb=256, max_output_bytes=100_000, max_processes=16)
TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"]
FORGED = (  # what the grader of issue 44's time wrote
    '{"passed": 2, "total": 2, "error": null, "isolation": {"network": true, "filesystem": true, "processes": true}}'
)
WRITE_EVERYWHERE = f"""
import os
def forge():
    for fd in range(256):  # the result pipe is one of them, wherever it is
        try:
            os.write(fd, {FORGED!r}.encode())
        except OSError:
            pass
"""

HOSTILE = {
    "replaces exec": "import builtins\nbuiltins.exec = lambda *args, **kwargs: None",
    "writes a fake report and leaves": WRITE_EVERYWHERE + "forge()\nos._exit(0)",
    "leaves before the tests": "import os\nos._exit(0)",
    "exits in atexit": "import atexit, sys\ndef add(a, b):\n    return a - b\natexit.register(lambda: sys.exit(0))",
    "patches AssertionError": WRITE_EVERYWHERE
    + """
import builtins, ctypes
def add(a, b):
    return a - b
class Forger(Exception):
    def __init__(self, *args):
        forge()
        os._exit(0)
builtins.AssertionError = Forger
ctypes.py_object.in_dll(ctypes.pythonapi, "PyExc_AssertionError").value = Forger
""",
    "traces the tests": WRITE_EVERYWHERE
    + """
import sys
def add(a, b):
    return a - b
def tracer(frame, event, argument):
    if frame.f_code.co_filename.startswith("test_"):
        forge()
        os._exit(0)
sys.settrace(tracer)
""",
    "answers with an object equal to anything": """
class Anything:
    def __eq__(self, other):
        return True
    __hash__ = object.__hash__
def add(a, b):
    return Anything()
""",
    "answers with an int that equals anything": """
class Three(int):
    def __eq__(self, other):
        return True
    __hash__ = int.__hash__
def add(a, b):
    return Three(0)
""",
    "shadows a builtin the tests use": "def add(a, b):\n    return a - b\ndef isinstance(*args):\n    return True",
    "breaks the protocol": "import os\nos.write(4, b'\\xff\\xff\\xff\\xff garbage')\ndef add(a, b):\n    return a + b",
}


@pytest.mark.parametrize("hack", list(HOSTILE))
def test_a_forged_result_scores_zero(hack):
    tests = TESTS + (["assert isinstance(add(1, 2), str)"] if hack == "shadows a builtin the tests use" else [])
    outcome = run_sandboxed(HOSTILE[hack], tests, SMALL)
    assert outcome.passed == 0, outcome


READ_THE_TESTS = """
import gc, sys
test = "assert add(1, 2) " + "== 3"  # in two parts, so that this source does not hold it
mine = globals()
found = [o for o in gc.get_objects() if isinstance(o, (dict, list)) and o is not mine and test in str(o)[:10000]]
frame = sys._getframe().f_back
while frame is not None:
    found += [value for value in frame.f_locals.values() if value is not mine and test in str(value)[:10000]]
    frame = frame.f_back
def add(a, b):
    return a + b
"""


def test_the_program_never_holds_the_tests():
    """Were the tests in its memory, a program could find the expected answers and return them."""
    outcome = run_sandboxed(READ_THE_TESTS, TESTS + ["assert found == []"], SMALL)
    assert outcome.passed == 3, outcome.error


@pytest.mark.parametrize(
    "report",
    [
        b'{"passed": 1e308, "total": 2, "error": null}',  # an infinite reward, once divided
        b'{"passed": true, "total": 2, "error": null}',
        b'{"passed": 3, "total": 2, "error": null}',
        b'{"passed": -1, "total": 2, "error": null}',
        b'{"passed": 2, "total": 3, "error": null}',
        b'{"passed": 2, "error": null}',  # a missing key used to fail the whole batch
        b'{"passed": 2, "total": 2, "error": null, "extra": 1}',
        b'{"passed": 2, "total": 2, "error": 5}',
        b"[2, 2, null]",
        b"",
        FORGED.encode() + FORGED.encode(),
    ],
)
def test_a_malformed_report_scores_zero_for_its_row_alone(report, registry):
    outcome = parse_report(report, 2)
    assert (outcome.passed, outcome.total, outcome.sandboxed) == (0, 2, True)
    reward = registry.build("reward", "code_execution", {"timeout_s": 1.0, "memory_mb": 256})
    assert [reward.score(outcome), reward.score(Outcome(2, 2, None))] == [0.0, 1.0]


def test_a_well_formed_report_is_read_as_written():
    assert parse_report(b'{"passed": 1, "total": 2, "error": "test 1 raised"}', 2) == Outcome(1, 2, "test 1 raised")
    assert parse_report(b'{"sandbox_error": "unshare: EPERM"}', 2) == Outcome(0, 2, "unshare: EPERM", False)


EVERY_KIND = "{'a': (1, 2.5, None), 3: {4, 5}, 'b': b'xy', 'c': 1j, 'd': [float('inf')], 'e': True, 'f': 10**30}"
HONEST = {
    "a class": (
        "class Stack:\n    def __init__(self):\n        self.items = []\n    def push(self, item):\n"
        "        self.items.append(item)\n    def pop(self):\n        return self.items.pop()\n"
        "    def __len__(self):\n        return len(self.items)",
        ["s = Stack()\ns.push(1)\ns.push(2)\nassert s.pop() == 2 and len(s) == 1 and s.items == [1]"],
    ),
    "a generator": ("def evens(n):\n    yield from range(0, n, 2)", ["assert list(evens(5)) == [0, 2, 4]"]),
    "an exception": (
        "def root(x):\n    if x < 0:\n        raise ValueError('negative')\n    return x ** 0.5",
        ["try:\n    root(-1)\nexcept ValueError as error:\n    message = str(error)\nelse:\n    message = None"]
        + ["assert message == 'negative'"],
    ),
    "the program's import math": (
        "import math\ndef area(r):\n    return math.pi * r * r",
        ["assert math.isclose(area(1), 3.141592653589793)"],
    ),
    "plain values of every kind": (
        f"def values():\n    return {EVERY_KIND}",
        [f"assert values() == {EVERY_KIND}", "assert type(values()['e']) is bool and type(values()['a']) is tuple"],
    ),
    "HumanEval's check(candidate)": (
        "def add(a, b):\n    return a + b",
        ["def check(candidate):\n    assert candidate(2, 3) == 5\ncheck(add)", "def twice():\n    return add(1, 1)"]
        + ["assert twice() == 2"],
    ),
    "a global of the program": ("LIMIT = 10", ["assert LIMIT == 10"]),
}


@pytest.mark.parametrize("case", list(HONEST))
def test_an_honest_program_is_graded(case):
    code, tests = HONEST[case]
    outcome = run_sandboxed(code, tests, SMALL)
    assert outcome.passed == len(tests), outcome.error


def test_an_endless_generator_cannot_fill_the_graders_memory():
    """Its answers, in all, are bounded: past 64 MiB the program fails, long before its time runs out."""
    endless = "def chunks():\n    chunk = 'x' * 4_000_000\n    while True:\n        yield chunk"
    outcome = run_sandboxed(endless, ["kept = list(chunks())"], dataclasses.replace(SMALL, timeout_s=30.0))
    assert outcome.passed == 0 and "answers exceeded" in outcome.error


def test_a_program_that_hangs_in_a_test_keeps_the_tests_passed_before():
    code = "def add(a, b):\n    return a + b\ndef spin():\n    while True:\n        pass"
    outcome = run_sandboxed(code, ["assert add(1, 2) == 3", "spin()"], dataclasses.replace(SMALL, timeout_s=1.0))
    assert outcome.passed == 1
    assert "CPU time ran out" in outcome.error or "timed out" in outcome.error
