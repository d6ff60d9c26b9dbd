"""A collective (joining the weight-transfer group, broadcasting a round of weights) and the HTTP request that makes
the server's workers take part in it, run side by side under one deadline.

Neither finishes alone: the server answers once its workers are done, and they are done once this process has
joined or sent. If the server fails its side (a tensor name its model refuses, a crash, a hung GPU), NCCL would
wait for it forever, where gloo notices a closed socket. So both run in daemon threads, and the server's error, the
collective's, or the deadline ends the wait; a collective left blocked stays behind in its thread while the run
stops.
"""

import threading
import time
from collections.abc import Callable

from grpo_kit.contract.errors import GenerationUnavailable

POLL_SECONDS = 0.05


class Background:
    """`work()` in a daemon thread: its result or error once `done` is set."""

    def __init__(self, work: Callable):
        self.done = threading.Event()
        self.result = self.error = None
        threading.Thread(target=self._run, args=(work,), daemon=True).start()

    def _run(self, work: Callable) -> None:
        try:
            self.result = work()
        except BaseException as error:  # handed to the waiting thread, which raises it
            self.error = error
        finally:
            self.done.set()


def alongside(request: Callable, collective: Callable, timeout: float, doing: str, base_url: str):
    """Run both; return the request's answer once both are done, or raise the first error, or fail at the deadline.

    The server's error comes first when both failed: it says why (the collective only sees a peer that left).
    """
    deadline = time.monotonic() + timeout
    answer, transfer = Background(request), Background(collective)
    while True:
        if answer.error is not None:
            raise answer.error
        if transfer.error is not None:  # this end failed, or the other end went away mid-broadcast
            raise GenerationUnavailable(
                f"{doing} with the vLLM server at {base_url} failed: {transfer.error}"
            ) from None
        if answer.done.is_set() and transfer.done.is_set():
            return answer.result
        if time.monotonic() > deadline:
            waiting_for = "its answer" if transfer.done.is_set() else "its workers to take part"
            raise GenerationUnavailable(
                f"{doing} with the vLLM server at {base_url} did not finish within generation.request_timeout="
                f"{timeout:g} s (waiting for {waiting_for}): the server may have died or hung."
            )
        answer.done.wait(POLL_SECONDS)
