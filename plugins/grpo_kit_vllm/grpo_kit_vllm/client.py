"""HTTP to a vLLM server: JSON requests with retries, and errors that say what the server said.

Standard library only, so that server mode needs nothing a trainer does not already have.
"""

import json
import logging
import time
import urllib.error
import urllib.request
from http.client import HTTPException

from grpo_kit.contract.errors import GenerationUnavailable, UserError

log = logging.getLogger(__name__)

BUSY_POLL_SECONDS = 0.5  # how often a request the server answered 503 (paused, busy) is asked again


class ServerError(UserError):
    """The server answered with an error, or none answers at all: what it said, and the request that caused it."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status  # the HTTP status, when the server answered


class ServerClient:
    def __init__(self, base_url: str, request_timeout: float, retries: int):
        self.base_url = base_url.rstrip("/")
        self.request_timeout = request_timeout
        self.retries = retries
        self.reconnected = False  # a request needed a retry since the flag was last cleared: it may be a new server

    def get(self, path: str, timeout: float | None = None) -> dict:
        return self._request("GET", path, None, timeout)

    def post(self, path: str, body: dict | None = None, timeout: float | None = None) -> dict:
        return self._request("POST", path, {} if body is None else body, timeout)

    def is_healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base_url}/health", timeout=5) as response:
                return response.status == 200
        except (OSError, HTTPException):
            return False

    def _request(self, method: str, path: str, body: dict | None, timeout: float | None) -> dict:
        url = f"{self.base_url}{path}"
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
        timeout = timeout or self.request_timeout
        # A 503 is the server asking to be asked again: vLLM 0.33 answers it while paused for a weight sync, which
        # may outlast any count of retries. So a 503 is retried until the request's own timeout has passed.
        busy_until = time.monotonic() + timeout
        failures = 0
        while True:
            try:
                with urllib.request.urlopen(request, timeout=timeout) as response:
                    payload = response.read()
                return json.loads(payload) if payload else {}
            except urllib.error.HTTPError as error:
                if error.code != 503:
                    raise ServerError(
                        f"The vLLM server at {self.base_url} refused {method} {path} with HTTP {error.code}: "
                        f"{error_message(error)}",
                        status=error.code,
                    ) from None
                busy = f"HTTP 503: {error_message(error)}"
                if time.monotonic() + BUSY_POLL_SECONDS > busy_until:
                    raise GenerationUnavailable(
                        f"The vLLM server at {self.base_url} answered {method} {path} with {busy} for "
                        f"generation.request_timeout={timeout:g} s."
                    ) from None
                time.sleep(BUSY_POLL_SECONDS)
                continue
            except TimeoutError:
                raise GenerationUnavailable(
                    f"The vLLM server at {self.base_url} did not answer {method} {path} within "
                    f"generation.request_timeout={timeout:g} s."
                ) from None
            except (OSError, HTTPException) as error:  # refused, reset, unreachable: the server may come back
                failure = str(getattr(error, "reason", error))
            if failures == self.retries:
                raise GenerationUnavailable(
                    f"The vLLM server at {self.base_url} stopped answering: {method} {path} failed "
                    f"{self.retries + 1} times, the last with {failure}."
                )
            wait = 2.0**failures
            log.warning(
                "The vLLM server at %s failed %s %s (%s): trying again in %.0f s",
                self.base_url,
                method,
                path,
                failure,
                wait,
            )
            time.sleep(wait)
            failures += 1
            self.reconnected = True


def error_message(error: urllib.error.HTTPError) -> str:
    """The message in vLLM's error body ({"error": {"message": ...}}), FastAPI's ({"detail": ...}), or the raw text."""
    text = error.read().decode(errors="replace")
    try:
        body = json.loads(text)
    except json.JSONDecodeError:
        return text.strip() or error.reason
    if isinstance(body, dict):
        inner = body.get("error", body.get("detail", body))
        if isinstance(inner, dict):
            return str(inner.get("message", inner))
        return str(inner)
    return text
