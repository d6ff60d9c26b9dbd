"""What the tests of a server need to talk to it: a free port to start one on, and a JSON call that returns errors
as answers (the HTTP status and vLLM's error body) instead of raising them."""

import json
import socket
import urllib.error
import urllib.request


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def call(url: str, path: str, body: dict | None = None) -> tuple[int, dict | None]:
    """GET `path`, or POST `body` as JSON; the HTTP status and the JSON answer, errors included."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            raw = response.read()
            return response.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())
