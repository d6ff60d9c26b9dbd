"""The grader: a row's tests run here, in a process the program cannot reach, against the program's objects there.

The program's process (sandbox_program.py) runs the code and then only answers requests: what its global names
hold, and what its objects return when called, indexed, iterated or asked for an attribute. Every answer comes back
as plain data (numbers, strings, bytes, lists, tuples, sets, dicts), decoded here into this interpreter's own
objects, or as a reference (`Remote`) to an object that stays there. The tests, Python's builtins, the `assert`
statements and the exceptions they raise are all this process's, so nothing the code does to its own interpreter
(patched builtins or exceptions, trace functions, exit handlers, a forged report) reaches the verdict. A test passes
when it raises nothing here and the program answered every request it made.

What the program decides is only what its own objects answer. So that it cannot decide a comparison by itself, a
Remote compares by identity (`==`, `<`, `in`, hashing): an object that claims to equal everything is equal to
nothing here. Names the tests find in Python's builtins are Python's own, and a module the program imported is
this process's copy of it where it is one of TEST_MODULES (else a Remote whose answers the program gives).
"""

import builtins
import importlib
import time

from grpo_kit_rewards.sandbox_program import (
    Ended,
    ProtocolError,
    TooLarge,
    decode,
    encode,
    parse,
    receive_frame,
    send,
)

# Standard modules whose functions tests call on what the program returns (math.isclose(f(x), 0.5), ...): imported
# here when the program imported them, so that the program's copy, which it may have patched, does not answer.
TEST_MODULES = frozenset(
    "math cmath re string itertools functools collections heapq bisect operator statistics fractions decimal "
    "random datetime json copy typing array numbers textwrap unicodedata".split()
)


class ProgramFailure(BaseException):
    """The program stopped answering as the protocol says: it ended, ran out of time, or sent what is not a value.
    A BaseException, so that a test's `except Exception` does not pass over it."""


class ProgramError(Exception):
    """An exception the program raised whose type is not one of Python's own exceptions."""


class Program:
    """The grader's end of the two pipes to the program's process."""

    def __init__(self, requests_fd: int, responses_fd: int, message_bytes: int, ending):
        self.requests, self.responses, self.message_bytes = requests_fd, responses_fd, message_bytes
        # All the program may send, so that a test iterating an endless generator of its does not fill this
        # process's memory before the deadline: sixteen answers of the largest size.
        self.budget = 16 * message_bytes
        self.ending = ending  # says how the program's process ended, once its pipe is closed
        self.deadline: float | None = None  # set when the code starts
        self.timeout_s = 0.0
        self.failure: str | None = None  # why it stopped answering, once it has
        self.failures = 0  # requests that met that failure: a test during which one did fails
        self.remotes: dict[int, Remote] = {}

    def run(self, code: str, timeout_s: float) -> dict:
        """Runs the code; its global names as this process sees them (raises what the code raised)."""
        self.deadline, self.timeout_s = time.monotonic() + timeout_s, timeout_s
        response = self._exchange({"op": "run", "code": code})
        if list(response) == ["names"] and type(response["names"]) is dict:
            try:
                return {
                    name: decode(value, self.resolve)
                    for name, value in response["names"].items()
                    if name.isidentifier() and not name.startswith("__") and not hasattr(builtins, name)
                }
            except ProtocolError as error:
                raise self.fail(f"the program broke the protocol: {error}") from None
        if list(response) == ["raised"]:
            self._outcome(response)  # raises what the code raised
        raise self.fail(f"the program broke the protocol: an answer to running it: {str(response)[:100]}")

    def request(self, operation: str, reference: int, **fields):
        return self._outcome(self._exchange({"op": operation, "ref": reference, **fields}))

    def encode(self, value):
        return encode(value, self._reference)

    def resolve(self, tag: str, body: list):
        identifier, name = body
        if type(name) is not str:
            raise ProtocolError(f"a {tag} whose name is not a string: {str(body)[:100]}")
        if tag == "module" and name in TEST_MODULES:
            return importlib.import_module(name)
        if identifier not in self.remotes:
            self.remotes[identifier] = Remote(self, identifier, f"module {name}" if tag == "module" else name)
        return self.remotes[identifier]

    def fail(self, why: str) -> ProgramFailure:
        self.failure = self.failure or why
        self.failures += 1
        return ProgramFailure(self.failure)

    def _exchange(self, message: dict):
        if self.failure:
            raise self.fail(self.failure)
        try:
            send(self.requests, message)
            frame = receive_frame(self.responses, min(self.message_bytes, self.budget), self.deadline)
            self.budget -= len(frame)
            response = parse(frame)
        except TimeoutError:
            raise self.fail(f"timed out after {self.timeout_s:g} s") from None
        except (Ended, BrokenPipeError):
            raise self.fail(f"the program ended ({self.ending()})") from None
        except TooLarge as error:
            if error.size <= self.message_bytes:
                raise self.fail(f"the program's answers exceeded the {16 * self.message_bytes} bytes allowed") from None
            raise self.fail(f"the program broke the protocol: {error}") from None
        except ProtocolError as error:
            raise self.fail(f"the program broke the protocol: {error}") from None
        if type(response) is not dict or len(response) != 1:
            raise self.fail(f"the program broke the protocol: an answer that is not one: {str(response)[:100]}")
        return response

    def _outcome(self, response: dict):
        if "value" in response:
            try:
                return decode(response["value"], self.resolve)
            except ProtocolError as error:
                raise self.fail(f"the program broke the protocol: {error}") from None
        raised = response.get("raised")
        if type(raised) is list and len(raised) == 2 and all(type(part) is str for part in raised):
            raise exception(*raised)
        raise self.fail(f"the program broke the protocol: an answer that is not one: {str(response)[:100]}")

    def _reference(self, value) -> dict:
        if isinstance(value, Remote) and value._program is self:
            return {"ref": [value._id, value._type]}
        raise TypeError(
            "the sandbox passes the program plain values (None, bool, int, float, complex, str, bytes, list, tuple, "
            f"set, frozenset, dict) and its own objects, not {type(value).__name__}"
        )


def exception(name: str, message: str) -> Exception:
    """The exception the program said it raised: Python's own type where it names one, else a ProgramError."""
    kind = getattr(builtins, name, None)
    if isinstance(kind, type) and issubclass(kind, Exception):
        try:
            return kind(message)
        except TypeError:  # a type that takes other arguments (UnicodeDecodeError)
            pass
    return ProgramError(f"{name}: {message}" if message else name)


class Remote:
    """An object that lives in the program's process: called, indexed, iterated and read there, compared here by
    identity alone."""

    __slots__ = ("_program", "_id", "_type")

    def __init__(self, program: Program, identifier: int, type_name: str):
        object.__setattr__(self, "_program", program)
        object.__setattr__(self, "_id", identifier)
        object.__setattr__(self, "_type", type_name)

    def _ask(self, operation: str, **fields):
        return self._program.request(operation, self._id, **fields)

    def __call__(self, *args, **kwargs):
        encoded = [self._program.encode(argument) for argument in args]
        keywords = [[key, self._program.encode(argument)] for key, argument in kwargs.items()]
        return self._ask("call", args=encoded, kwargs=keywords)

    def __getattr__(self, name: str):
        if name.startswith("__"):  # Python's own probes (__length_hint__, __array__, ...) stay here
            raise AttributeError(name)
        return self._ask("getattr", name=name)

    def __setattr__(self, name: str, value) -> None:
        self._ask("setattr", name=name, value=self._program.encode(value))

    def __getitem__(self, key):
        return self._ask("getitem", key=self._program.encode(key))

    def __setitem__(self, key, value) -> None:
        self._ask("setitem", key=self._program.encode(key), value=self._program.encode(value))

    def __len__(self) -> int:
        return self._ask("len")

    def __iter__(self):
        return self._ask("iter")

    def __next__(self):
        return self._ask("next")

    def __bool__(self) -> bool:
        return self._ask("bool")

    def __str__(self) -> str:
        return self._ask("str")

    def __repr__(self) -> str:
        return f"<the program's {self._type}>"


def grade(program: Program, code: str, tests: list[str], timeout_s: float) -> tuple[int, str | None]:
    """(tests passed, why not all did)."""
    try:
        names = program.run(code, timeout_s)
    except ProgramFailure as failure:
        return 0, str(failure)
    except Exception as failure:  # what the code raised (its SystemExit too, as a ProgramError)
        return 0, f"the program raised {describe(failure)}"
    namespace = {"__builtins__": builtins, "__name__": "__main__"} | names
    passed, error = 0, None
    for index, test in enumerate(tests):
        failures = program.failures
        try:
            exec(compile(test, f"test_{index}.py", "exec"), namespace)
        except BaseException as failure:
            error = error or f"test {index} raised {describe(failure)}"
            continue
        if program.failures != failures:  # the test caught the program's failure itself
            error = error or f"test {index}: {program.failure}"
            continue
        passed += 1
    return passed, error


def describe(failure: BaseException) -> str:
    if isinstance(failure, (ProgramError, ProgramFailure)):
        return str(failure)
    message = str(failure)
    return type(failure).__name__ + (f": {message[:200]}" if message else "")
