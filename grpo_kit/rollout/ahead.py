"""Asynchronous generation (algorithm.max_staleness = K >= 1, docs/async.md): a worker thread draws the prompts of
the next generation batches and generates them while the trainer trains on this one.

Each batch is tagged with the weight version that sampled it (the optimizer steps those weights had taken). The
worker starts a batch only once the weights are recent enough that, when the trainer reaches it, they are at most
K steps behind; so it pauses when it is K ahead, and the trainer waits when it is behind. A weight update reaches
the backend between two requests: `update_weights` waits for the request under way, and the worker's next one
waits for the update.

The worker only generates. Drawing prompts is cheap and reproducible; scoring, advantages and every log-prob stay on
the training thread, which owns the model and every collective call: with several processes, each process's
worker asks the backend for its own prompts (`generate_in_background`).
"""

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from grpo_kit.contract.kinds import Completions, declared


@dataclass
class Generated:
    """A generation batch's rows and completions, before scoring."""

    rows: list[dict]  # each prompt's row, repeated num_generations times
    prompt_ids: list[list[int]]
    completions: list  # as the rewards read them: texts, or assistant messages
    generated: Completions
    extra_columns: dict[str, list]
    weight_version: int = 0  # the optimizer steps of the weights that sampled it
    generator_waited: float = 0.0  # seconds the worker waited for recent enough weights before generating it


@dataclass
class Pending:
    """A batch the worker has drawn the prompts of: its sampler state before the draw, and once done, the batch."""

    sampler_state: dict
    generated: Generated | None = None


class GenerationAhead:
    """The run's generation backend as the trainer sees it (a Generation itself), with a worker generating ahead.

    `generate` (evaluation, a hook's redraw), `sampling` and `update_weights` run on the training thread, each
    taking its turn with the worker's requests; `take` hands the trainer the next batch in order. It is built with
    the run's other parts, and its worker starts once the run knows where it stands (`start_worker`).
    """

    def __init__(self, backend, sampler, max_staleness: int):
        self.backend, self.sampler, self.max_staleness = backend, sampler, max_staleness
        self.num_prompts, self.generate_rows, self.version_at_take = 0, None, None  # set by start_worker
        self.version = 0  # the weights' optimizer steps now
        self.turn = threading.RLock()  # one request at a time: the worker's, or the training thread's
        self.condition = threading.Condition()  # guards everything below, and the sampler
        self.pending: deque[Pending] = deque()  # drawn and not yet taken, oldest first
        self.drawn = 0  # batches drawn since the worker started: the next one's index
        self.error: BaseException | None = None
        self.stopping = False
        self.last_taken: dict[str, float] = {}
        self.worker = threading.Thread(target=self._work, name="grpo_kit-generation-ahead", daemon=True)

    def start_worker(
        self,
        num_prompts: int,  # per batch, this process's
        generate_rows: Callable,  # (rows, generate) -> Generated: the rollout's generation part
        version: int,  # the weights' optimizer steps now
        version_at_take: Callable[[int], int],  # the n-th batch the worker draws: the weights' steps when it is taken
    ) -> None:
        self.num_prompts, self.generate_rows = num_prompts, generate_rows
        self.version, self.version_at_take = version, version_at_take
        self.worker.start()

    # --- the worker ---

    def _work(self) -> None:
        try:
            while True:
                with self.condition:
                    started = time.perf_counter()
                    index = self.drawn
                    self.condition.wait_for(lambda: self.stopping or self._may_generate(index))
                    if self.stopping:
                        return
                    waited = time.perf_counter() - started
                    pending = Pending(self.sampler.state())
                    rows = self.sampler.draw(self.num_prompts)
                    self.pending.append(pending)
                    self.drawn += 1
                with self.turn:
                    version = self.version
                    background = declared(self.backend, "generation", "generate_in_background")
                    generated = self.generate_rows(rows, generate=background)
                generated.weight_version, generated.generator_waited = version, waited
                with self.condition:
                    pending.generated = generated
                    self.condition.notify_all()
        except BaseException as error:  # the trainer raises it when it next takes a batch
            with self.condition:
                self.error = error
                self.condition.notify_all()

    def _may_generate(self, index: int) -> bool:
        """Whether the `index`-th batch may be generated now: it would be at most max_staleness steps old when
        taken, and at most max_staleness batches wait to be taken (several batches may serve one step)."""
        fresh_enough = self.version >= self.version_at_take(index) - self.max_staleness
        return fresh_enough and len(self.pending) < max(self.max_staleness, 1)

    # --- the training thread ---

    def take(self) -> Generated:
        """The next batch, waiting for the worker if it is behind."""
        started = time.perf_counter()
        with self.condition:
            self.condition.wait_for(lambda: self.error is not None or (self.pending and self.pending[0].generated))
            if self.error is not None:
                raise self.error
            generated = self.pending.popleft().generated
            self.condition.notify_all()
        # The staleness is measured where each micro-step trains on it (grpo_kit/training/staleness_metrics.py).
        self.last_taken = {
            "async/trainer_wait_seconds": time.perf_counter() - started,
            "async/generator_wait_seconds": generated.generator_waited,
        }
        return generated

    def draw(self, num_prompts: int) -> list[dict]:
        """Prompts drawn now on the training thread (a hook's redraw), in turn with the worker's draws."""
        with self.condition:
            return self.sampler.draw(num_prompts)

    def update_weights(self, model, step: int) -> None:
        with self.turn:  # the worker's next request, which reads the version, waits for both
            self.backend.update_weights(model, step)
            with self.condition:
                self.version = step
                self.condition.notify_all()

    def generate(self, prompt_ids: list[list[int]], with_logprobs: bool = False) -> Completions:
        with self.turn:
            return self.backend.generate(prompt_ids, with_logprobs=with_logprobs)

    def sampling(self, temperature: float | None, top_p: float | None):
        """The backend's own, holding the turn throughout, so that the worker never samples with evaluation's."""
        context = declared(self.backend, "generation", "sampling")(temperature, top_p)
        return None if context is None else _holding(self.turn, context)

    def sampler_state(self) -> dict:
        """Where a resume draws again: before the oldest batch drawn and not yet trained on."""
        with self.condition:
            return self.pending[0].sampler_state if self.pending else self.sampler.state()

    def in_flight(self) -> int:
        with self.condition:
            return len(self.pending)

    def close(self) -> None:
        with self.condition:
            self.stopping = True
            self.condition.notify_all()
        if self.worker.is_alive():
            self.worker.join(timeout=60)  # a request under way ends by the backend's own timeout
        self.backend.close()


@contextlib.contextmanager
def _holding(lock, context):
    with lock, context:
        yield
