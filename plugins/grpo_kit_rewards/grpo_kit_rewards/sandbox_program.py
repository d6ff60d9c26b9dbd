"""The program's side of the sandbox: it runs the code, then answers the grader's requests; and their shared protocol.

This file is executed inside the sandbox as `python -I -c SOURCE` (sandbox_child.py), in a fresh interpreter that
holds nothing of the grader's: not the tests, not the result pipe. The grader (sandbox_grader.py) imports it for
the protocol alone: length-prefixed JSON frames on two pipes, and values encoded as plain data. Once the code has
run, everything in this process is the code's to rewrite, this loop included: the grader trusts nothing it says
beyond plain values, which it decodes into its own objects.

Values: None, bool, int, float, str are JSON's own; list, tuple, set, frozenset, dict, bytes and complex are tagged
(`{"list": [...]}`); anything else stays here and is named by a reference (`{"ref": [id, type name]}`) that the
grader can call, index, iterate, and read attributes of. A module is `{"module": [id, name]}`.
"""

import builtins
import json
import os
import select
import struct
import time

REQUESTS_FD, RESPONSES_FD = 3, 4  # in the program's process
HEADER = struct.Struct(">I")
NAME_BYTES = 65536  # a global of the program larger than this, encoded, is passed by reference
CONTAINERS = {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}


class ProtocolError(Exception):
    """A frame or value that does not follow the protocol."""


class TooLarge(ProtocolError):
    """A message longer than the reader takes."""

    def __init__(self, size: int, limit: int):
        super().__init__(f"a message of {size} bytes, more than the {limit} allowed")
        self.size = size


class Ended(Exception):
    """The other side closed its pipe."""


def send(fd: int, message) -> None:
    data = json.dumps(message, separators=(",", ":")).encode()
    data = HEADER.pack(len(data)) + data
    while data:
        data = data[os.write(fd, data) :]


def receive(fd: int, limit: int, deadline: float | None = None):
    """The next message on `fd`; at most `limit` bytes, waiting until `deadline` (time.monotonic()) at most."""
    return parse(receive_frame(fd, limit, deadline))


def receive_frame(fd: int, limit: int, deadline: float | None = None) -> bytes:
    (size,) = HEADER.unpack(_read(fd, HEADER.size, deadline))
    if size > limit:
        raise TooLarge(size, limit)
    return _read(fd, size, deadline)


def parse(frame: bytes):
    try:
        return json.loads(frame)
    except (ValueError, RecursionError) as error:
        raise ProtocolError(f"a message that is not JSON ({error})") from None


def _read(fd: int, size: int, deadline: float | None) -> bytes:
    chunks = []
    while size:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                raise TimeoutError
        chunk = os.read(fd, size)
        if not chunk:
            raise Ended
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def encode(value, refer, path: tuple = ()):
    """`value` as plain data; what is not plain data becomes `refer(value)`."""
    kind = type(value)
    if value is None or kind in (bool, str):
        return value
    if kind is int:
        return value if value.bit_length() < 4000 else refer(value)  # JSON's reader refuses over 4300 digits
    if kind is float:
        return value if value == value and abs(value) != float("inf") else {"float": repr(value)}
    if kind is bytes:
        return {"bytes": value.hex()}
    if kind is complex:
        return {"complex": [encode(value.real, refer), encode(value.imag, refer)]}
    if kind in (list, tuple, set, frozenset, dict) and id(value) not in path:
        path += (id(value),)
        if kind is dict:
            return {"dict": [[encode(key, refer, path), encode(item, refer, path)] for key, item in value.items()]}
        return {kind.__name__: [encode(item, refer, path) for item in value]}
    return refer(value)


def decode(data, resolve):
    """Plain data back into objects of this interpreter; `resolve(tag, body)` makes references and modules."""
    if data is None or type(data) in (bool, int, float, str):
        return data
    if type(data) is not dict or len(data) != 1:
        raise ProtocolError(f"not an encoded value: {str(data)[:100]}")
    ((tag, body),) = data.items()
    try:
        if tag in CONTAINERS:
            return CONTAINERS[tag](decode(item, resolve) for item in _list(body))
        if tag == "dict":
            return {decode(key, resolve): decode(item, resolve) for key, item in (_pair(pair) for pair in _list(body))}
        if tag == "float" and body in ("nan", "inf", "-inf"):
            return float(body)
        if tag == "bytes" and type(body) is str:
            return bytes.fromhex(body)
        if tag == "complex" and type(body) is list and len(body) == 2 and all(type(part) is float for part in body):
            return complex(*body)
        if tag in ("ref", "module") and type(body) is list and len(body) == 2 and type(body[0]) is int:
            return resolve(tag, body)
    except (TypeError, ValueError, RecursionError) as error:  # an unhashable key or member, a bad hex string
        raise ProtocolError(f"a malformed {tag}: {error}") from None
    raise ProtocolError(f"not an encoded value: {str(data)[:100]}")


def _list(body) -> list:
    if type(body) is not list:
        raise ProtocolError(f"a container whose items are not a list: {str(body)[:100]}")
    return body


def _pair(pair) -> list:
    if type(pair) is not list or len(pair) != 2:
        raise ProtocolError(f"a dict item that is not a [key, value] pair: {str(pair)[:100]}")
    return pair


class Server:
    """Runs the code, then answers the grader: what its names hold, and what its objects do when asked."""

    def __init__(self, message_bytes: int):
        self.message_bytes = message_bytes
        self.objects: dict[int, object] = {}
        self.namespace = {"__name__": "__main__", "__builtins__": builtins}

    def refer(self, value) -> dict:
        self.objects[id(value)] = value
        if type(value) is type(os):
            return {"module": [id(value), value.__name__]}
        return {"ref": [id(value), type(value).__name__]}

    def resolve(self, tag: str, body: list):
        return self.objects[body[0]]

    def value(self, data):
        return decode(data, self.resolve)

    def answer(self, request: dict):
        operation = request["op"]
        if operation == "run":
            exec(compile(request["code"], "solution.py", "exec"), self.namespace)
            return self.names()
        target = self.objects[request["ref"]]
        if operation == "call":
            arguments = [self.value(argument) for argument in request["args"]]
            keywords = {key: self.value(argument) for key, argument in request["kwargs"]}
            return target(*arguments, **keywords)
        if operation == "getattr":
            return getattr(target, request["name"])
        if operation == "setattr":
            return setattr(target, request["name"], self.value(request["value"]))
        if operation == "getitem":
            return target[self.value(request["key"])]
        if operation == "setitem":
            target[self.value(request["key"])] = self.value(request["value"])
            return None
        unary = {"len": len, "iter": iter, "next": next, "bool": bool, "str": str, "repr": repr}
        return unary[operation](target)

    def names(self) -> dict:
        """The code's global names (not its dunders) and what they hold, a large value by reference."""
        names = {}
        for name, value in list(self.namespace.items()):
            if name.startswith("__"):
                continue
            encoded = encode(value, self.refer)
            if len(json.dumps(encoded)) > NAME_BYTES:
                encoded = self.refer(value)
            names[name] = encoded
        return {"names": names}

    def serve(self) -> None:
        send(RESPONSES_FD, {"ready": True})
        while True:
            try:
                request = receive(REQUESTS_FD, self.message_bytes)
            except Ended:
                return
            try:
                result = self.answer(request)
                response = result if request["op"] == "run" else {"value": encode(result, self.refer)}
                if request["op"] != "run" and len(json.dumps(response)) > self.message_bytes:
                    response = {"value": self.refer(result)}  # too large to copy: the grader may still index it
            except BaseException as failure:  # SystemExit too: the grader sees how the code ended
                response = {"raised": [type(failure).__name__, str(failure)[:500]]}
            send(RESPONSES_FD, response)


if __name__ == "__main__":
    import sys

    Server(int(sys.argv[1])).serve()
