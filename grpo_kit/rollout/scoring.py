"""Scoring: every selected reward on every completion, as an (N, K) matrix with NaN for "no opinion".

The rewards of a batch run at the same time: `async def` rewards as coroutines on one event loop, other rewards
each in a thread of their own, and rewards that declare `cpu_heavy = True` (math verifiers: sympy holds the GIL) in
a pool of worker processes, the batch split among the workers. A CPU-heavy reward may also have a method
`quick_scores` (called as the reward is), which returns {row: score} for the completions it can score without its
heavy work (a plain number to compare, say): those are scored in this process, and only the rest go to the
workers. The pool starts when a batch first has completions for it, so a run whose answers are all quick to score
never pays for its processes. No reward holds a run up for longer than `timeout`:
a call that runs past it or raises gives None for its completions and is counted in `rewards/NAME/failures`,
except a RewardError, which a reward raises to stop the run (an LLM judge told to stop when it gets no answer). A
reward that returns None for every completion of a batch is warned about too (once): a completion that no reward
scores trains on nothing, so a run whose rewards all do that trains on nothing at all. A result the run cannot use
(wrong length, a value that is not a finite number) is a bug in the reward, not bad luck, so it stops the run with
RewardError.

Besides the dataset's columns, every reward is handed TRL's keyword arguments: `trainer_state` (a transformers
TrainerState: global_step, max_steps, epoch, ...), `log_extra(column, values)` (a column of the sample tables, one
value per completion) and `log_metric(name, value)` (a metric, averaged over the batch's calls); in a run with an
environment, `environments` too (the completions' environment instances, after their episodes). Rewards that run in
worker processes get only `trainer_state` (its fields, in a SimpleNamespace): what they logged there could not
come back, and environments need not pickle.
"""

import asyncio
import concurrent.futures
import dataclasses
import inspect
import logging
import math
import multiprocessing
import numbers
import os
import pickle
import threading
import types
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from grpo_kit.contract.advantages import weighted_rewards
from grpo_kit.contract.errors import PluginError, RewardError
from grpo_kit.contract.kinds import declared

log = logging.getLogger(__name__)

FLOAT32_MAX = torch.finfo(torch.float32).max

# The CPUs this process may use (a container's or taskset's share of the machine), where the platform says.
_CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
DEFAULT_WORKERS = min(8, _CPUS)  # processes for CPU-heavy rewards when the caller names no number
# Workers never fork the training process itself: forking a process that runs threads (and CUDA) is unsafe.
_START_METHOD = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


LOGGING_ARGUMENTS = ("log_extra", "log_metric")  # TRL's keyword arguments that log from inside a reward
IN_PROCESS_ARGUMENTS = (*LOGGING_ARGUMENTS, "environments")  # never sent to a worker process


@dataclass
class Scores:
    rewards: torch.Tensor  # (N, K) float32, NaN for "no opinion"
    metrics: dict[str, float]  # failures per reward, and what the rewards logged with log_metric
    extra_columns: dict[str, list] = field(default_factory=dict)  # what they logged with log_extra, N values each


class RewardLogs:
    """What the rewards of one batch log through `log_extra` and `log_metric`, as TRL collects it."""

    def __init__(self):
        self.columns: defaultdict[str, list] = defaultdict(list)
        self.metrics: defaultdict[str, list[float]] = defaultdict(list)

    def log_extra(self, column: str, values: list) -> None:
        self.columns[column].extend(values)

    def log_metric(self, name: str, value: float) -> None:
        self.metrics[name].append(float(value))


def reward_trainer_state(max_steps: int, epochs: float, **fields):
    """The `trainer_state` rewards receive: a transformers TrainerState, as TRL hands its own, over a run of
    `max_steps` optimizer steps that covers `epochs` passes over the prompts. `at_step` moves it on."""
    from transformers.trainer_callback import TrainerState  # the Trainer's machinery: loaded only when asked for

    return TrainerState(max_steps=max_steps, num_train_epochs=epochs, **fields)


def at_step(trainer_state, step: int) -> None:
    """`trainer_state` after `step` optimizer steps: as TRL's, global_step is the steps done when a batch is scored."""
    trainer_state.global_step = step
    trainer_state.epoch = trainer_state.num_train_epochs * step / max(trainer_state.max_steps, 1)


@dataclass
class _Call:
    """One call of one reward on some completions of the batch: their rows, in the order of its values."""

    name: str
    rows: list[int]
    future: concurrent.futures.Future


class Scorer:
    """`scorer.score(prompts, completions, completion_ids, columns)` -> Scores; `scorer(...)` -> ((N, K) float32
    rewards, metrics), without the extra columns.

    `timeout` bounds each batch's scoring, in seconds. `workers` is the size of the process pool for CPU-heavy
    rewards (None: DEFAULT_WORKERS); 0 runs them in threads like the others. `trainer_state` is what rewards
    receive as `trainer_state` (`reward_trainer_state`; by default one of step 0). Close the scorer (or use it in a
    `with` block) to stop its worker processes.
    """

    def __init__(
        self, rewards: dict[str, Callable], timeout: float = 60.0, workers: int | None = None, trainer_state=None
    ):
        workers = DEFAULT_WORKERS if workers is None else workers
        if timeout <= 0 or workers < 0:
            raise ValueError(f"Scorer needs timeout > 0 and workers >= 0, got timeout={timeout}, workers={workers}.")
        self.rewards, self.timeout, self.workers = dict(rewards), timeout, workers
        self.trainer_state = reward_trainer_state(0, 0.0) if trainer_state is None else trainer_state
        self.in_processes = {name for name, f in self.rewards.items() if workers and declared(f, "reward", "cpu_heavy")}
        for name in self.in_processes:
            _check_picklable(name, self.rewards[name])
            _check_logs_nothing(name, self.rewards[name])
        self._warned: set[str] = set()  # rewards that failed
        self._warned_no_opinion: set[str] = set()  # rewards that had no opinion on a whole batch
        # One loop for the whole run, as TRL keeps one: async clients (HTTP sessions) are bound to their loop.
        self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self._loop.run_forever, name="grpo_kit-rewards", daemon=True)
        self._loop_thread.start()
        self._pool = None  # started by the first batch that needs it

    def at_step(self, step: int) -> None:
        """The rewards' `trainer_state` after `step` optimizer steps: the trainer moves it here, and nowhere else."""
        at_step(self.trainer_state, step)

    def __call__(
        self, prompts: list, completions: list, completion_ids: list[list[int]], columns: dict
    ) -> tuple[torch.Tensor, dict[str, float]]:
        scores = self.score(prompts, completions, completion_ids, columns)
        return scores.rewards, scores.metrics

    def score(self, prompts: list, completions: list, completion_ids: list[list[int]], columns: dict) -> Scores:
        logs = RewardLogs()  # this batch's own: a reward abandoned after the timeout that logs later changes nothing
        arguments = {
            "prompts": prompts,
            "completions": completions,
            "completion_ids": completion_ids,
            **columns,
            "trainer_state": self.trainer_state,
            "log_extra": logs.log_extra,
            "log_metric": logs.log_metric,
        }
        calls = [call for name in self.rewards for call in self._start(name, arguments, len(completions))]
        concurrent.futures.wait([call.future for call in calls], timeout=self.timeout)

        scores = torch.full((len(completions), len(self.rewards)), math.nan)
        failures = dict.fromkeys(self.rewards, 0)
        column = {name: index for index, name in enumerate(self.rewards)}
        worker_stuck = False
        for call in calls:
            if not call.future.done():
                call.future.cancel()  # stops a coroutine; a thread or a process cannot be stopped, only abandoned
                self._failed(call.name, f"timed out after {self.timeout:g} s")
                worker_stuck |= call.name in self.in_processes
            elif isinstance(call.future.exception(), RewardError):
                raise call.future.exception()
            elif call.future.exception() is not None:
                self._failed(call.name, f"raised {call.future.exception()!r}", call.future.exception())
            else:
                values = _checked(call.name, call.future.result(), call.rows)
                scores[call.rows, column[call.name]] = torch.tensor(values)
                continue
            failures[call.name] += 1
        for name, index in column.items():
            if not failures[name] and scores[:, index].isnan().all():
                self._no_opinion(name)
        if worker_stuck:
            self._start_pool()  # a fresh pool: the stuck worker would hold its place forever
        metrics = {f"rewards/{name}/failures": float(count) for name, count in failures.items()}
        metrics |= {name: sum(values) / len(values) for name, values in logs.metrics.items()}
        return Scores(scores, metrics, _extra_columns(logs.columns, len(completions)))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.terminate()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._loop_thread.join(timeout=1.0)
        if not self._loop_thread.is_alive():  # else a coroutine blocks the loop: leave it to the daemon thread
            self._loop.close()

    def __enter__(self) -> "Scorer":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _start(self, name: str, arguments: dict, count: int) -> list[_Call]:
        function = self.rewards[name]
        if name in self.in_processes:
            return self._in_processes(name, function, arguments, count)
        if _is_async(function):
            future = asyncio.run_coroutine_threadsafe(_awaited(function, arguments), self._loop)
        else:
            future = concurrent.futures.Future()
            # A daemon thread of its own, not a pool's: a reward stuck forever neither starves the next batch
            # of threads nor keeps the interpreter from exiting.
            threading.Thread(target=_run, args=(future, function, arguments), daemon=True).start()
        return [_Call(name, list(range(count)), future)]

    def _in_processes(self, name: str, function: Callable, arguments: dict, count: int) -> list[_Call]:
        """Its quick scores from this process, and a call in a worker for each share of the other completions."""
        quick = concurrent.futures.Future()
        _run(quick, declared(function, "reward", "quick_scores"), arguments)
        if quick.exception() is not None:  # as if the reward itself had raised: the whole batch scores None
            return [_Call(name, list(range(count)), quick)]
        settled = quick.result()
        calls = []
        if settled:
            values = concurrent.futures.Future()
            values.set_result(list(settled.values()))
            calls.append(_Call(name, list(settled), values))
        rest = [row for row in range(count) if row not in settled]
        return calls + [self._in_process(name, function, arguments, rows) for rows in self._shares(rest)]

    def _in_process(self, name: str, function: Callable, arguments: dict, rows: list[int]) -> _Call:
        if self._pool is None:
            self._start_pool()
        count = len(arguments["completions"])
        share = {
            key: [value[row] for row in rows] if _per_completion(value, count) else value
            for key, value in arguments.items()
            if key not in IN_PROCESS_ARGUMENTS
        }
        # Its fields, not the TrainerState itself, whose class would make the worker import transformers' Trainer.
        share["trainer_state"] = types.SimpleNamespace(**dataclasses.asdict(self.trainer_state))
        future = concurrent.futures.Future()
        # The reward itself is the task, so a worker imports only the reward's module, never the core.
        self._pool.apply_async(function, (), share, callback=future.set_result, error_callback=future.set_exception)
        return _Call(name, rows, future)

    def _shares(self, rows: list[int]) -> list[list[int]]:
        """`rows` split into one consecutive share per worker (fewer when there are fewer rows)."""
        pieces = min(self.workers, len(rows))
        if not pieces:  # every completion was scored quickly
            return []
        bounds = [len(rows) * piece // pieces for piece in range(pieces + 1)]
        return [rows[start:stop] for start, stop in zip(bounds, bounds[1:])]

    def _start_pool(self) -> None:
        # Inside a launcher's worker (joblib's loky) the default start method is the launcher's own, which the
        # pool's processes, never importing it, cannot set up: give them the platform's.
        if multiprocessing.get_start_method(allow_none=True) not in multiprocessing.get_all_start_methods():
            multiprocessing.set_start_method(None, force=True)
        if self._pool is not None:
            self._pool.terminate()
        context = multiprocessing.get_context(_START_METHOD)
        if _START_METHOD == "forkserver":
            # The server (the process's first pool starts it) imports the rewards' modules once; every worker, and
            # every replacement of a stuck one, is then a quick fork of it.
            modules = {getattr(self.rewards[name], "__module__", None) for name in self.in_processes}
            context.set_forkserver_preload(["__main__", *sorted(modules - {None, "builtins"})])
        self._pool = context.Pool(self.workers)

    def _failed(self, name: str, cause: str, error: BaseException | None = None) -> None:
        if name in self._warned:
            return
        self._warned.add(name)
        log.warning(
            "Reward %r %s: its completions score None (no opinion) in this batch and the run goes on. Later "
            "failures of %r are not logged again; rewards/%s/failures counts them.",
            name,
            cause,
            name,
            name,
            exc_info=error,
        )

    def _no_opinion(self, name: str) -> None:
        if name in self._warned_no_opinion:
            return
        self._warned_no_opinion.add(name)
        log.warning(
            "Reward %r returned None (no opinion) for every completion of a batch. A completion that no reward "
            "scores has advantage 0: if no reward scores a batch, its step trains on nothing (reward null, loss 0). "
            "Later such batches of %r are not logged again; rewards/%s/mean is null for them.",
            name,
            name,
            name,
        )


def _is_async(function: Callable) -> bool:
    return (
        declared(function, "reward", "is_coroutine")
        or inspect.iscoroutinefunction(function)
        or inspect.iscoroutinefunction(getattr(function, "__call__", None))
    )


async def _awaited(function: Callable, arguments: dict):
    result = function(**arguments)
    return await result if inspect.isawaitable(result) else result


def _run(future: concurrent.futures.Future, function: Callable, arguments: dict) -> None:
    if not future.set_running_or_notify_cancel():
        return
    try:
        future.set_result(function(**arguments))
    except BaseException as error:  # anything, so that the future always settles
        future.set_exception(error)


def _per_completion(value, count: int) -> bool:
    return isinstance(value, (list, tuple)) and len(value) == count


def _check_picklable(name: str, function: Callable) -> None:
    try:
        pickle.dumps(function)
    except Exception as error:
        raise PluginError(
            f"Reward {name!r} declares cpu_heavy = True, so it runs in worker processes, but it cannot be sent to "
            f"one ({error!r}). Define it at module level (a function, or an instance of a module-level class), "
            "or do not declare it cpu_heavy, and it runs in a thread."
        ) from error


def _check_logs_nothing(name: str, function: Callable) -> None:
    parameters = inspect.signature(getattr(function, "function", function)).parameters
    logging = [argument for argument in LOGGING_ARGUMENTS if argument in parameters]
    if logging:
        raise PluginError(
            f"Reward {name!r} declares cpu_heavy = True, so it runs in worker processes, but it takes "
            f"{' and '.join(logging)}, which cannot log from there. Run it in a thread (trainer.reward_workers=0, or "
            "do not declare it cpu_heavy), or log nothing from it."
        )


def _extra_columns(columns: dict[str, list], count: int) -> dict[str, list]:
    for column, values in columns.items():
        if len(values) != count:
            raise RewardError(
                f"The rewards logged {len(values)} values in the column {column!r} with log_extra for {count} "
                "completions: log one value per completion, once per batch."
            )
    return dict(columns)


def checked_weighted_rewards(rewards_per_func: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:  # (N,)
    """The weighted sum of each completion's rewards (NaN: no opinion, left out), refused where it overflows
    float32: every advantage of the batch would be NaN, and the run would go on learning nothing."""
    rewards = weighted_rewards(rewards_per_func, weights)  # (N,)
    if not torch.isfinite(rewards).all():
        row = int((~torch.isfinite(rewards)).nonzero()[0])
        raise RewardError(
            f"The weighted sum of the rewards of completion {row} is {rewards[row].item()}: the rewards "
            f"{rewards_per_func[row].tolist()} times their weights {weights.tolist()} overflow float32 (3.4e38). "
            "Scale the rewards or their weights down."
        )
    return rewards


def _checked(name: str, values, rows: list[int]) -> list[float]:
    if hasattr(values, "tolist"):  # a numpy array or a tensor, which TRL accepts too
        values = values.tolist()
    if not isinstance(values, (list, tuple)) or len(values) != len(rows):
        got = f"{len(values)} values" if isinstance(values, (list, tuple)) else f"a {type(values).__name__}"
        raise RewardError(
            f"Reward {name!r} returned {got} for {len(rows)} completions: it must return a list with one number "
            "(or None for no opinion) per completion."
        )
    checked = []
    for row, value in zip(rows, values):
        if value is None:
            checked.append(math.nan)
        elif not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise RewardError(
                f"Reward {name!r} returned {value!r} for completion {row}: each value must be a finite "
                "number, or None for no opinion."
            )
        elif abs(value) > FLOAT32_MAX:  # finite in Python, infinite in the float32 scores
            raise RewardError(
                f"Reward {name!r} returned {value!r} for completion {row}, beyond float32's range (|r| <= 3.4e38) in "
                "which the scores are kept: it would become infinite. Scale the reward down."
            )
        else:
            checked.append(float(value))
    return checked
