"""Phase timers for `race.py --profile`: wrappers around the functions a step is made of, recording each call as
(phase, start, end, peak MiB).

On CUDA, kernels run after the call that queued them returns, so a phase's wall time says little until the GPU is
waited for at its boundaries: with `synchronize` on (race.py sets it for --profile on a GPU), every phase begins and
ends with `torch.cuda.synchronize()`, and records the peak allocated CUDA memory within it (None on a CPU, whose
resident peak cannot be reset without losing the process's own). Phases nest (a rollout holds generate and score):
the peak counter is reset at every boundary and each open phase keeps the highest reading seen while it was open,
and `overall_peak_mib` keeps the process's, which the resets would otherwise lose.

Its top level imports only the standard library (race.py's TRL child must not pay for torch before it wants it).
"""

import sys
import time


class PhaseTimer:
    def __init__(self):
        self.intervals: list[tuple[str, float, float, float | None]] = []
        self.synchronize = False  # set before the first phase: on CUDA, wait for the GPU at every boundary
        self._open: list[list[float]] = []  # the peak MiB seen so far by each phase still open, innermost last
        self._overall = 0.0

    def wrap(self, owner, attribute: str, phase) -> None:
        """Time every call of `owner.attribute` as `phase` (a name, or a function of the call's arguments)."""
        original = getattr(owner, attribute)

        def timed(*args, **kwargs):
            opened = self._begin()
            try:
                return original(*args, **kwargs)
            finally:
                name = phase(*args, **kwargs) if callable(phase) else phase
                self._end(name, opened)

        setattr(owner, attribute, timed)

    def time(self, phase: str):
        return _Interval(self, phase)

    def overall_peak_mib(self) -> float | None:
        """The process's peak allocated CUDA memory, resets or not (None where it used no CUDA)."""
        cuda = _cuda()
        return None if cuda is None else max(self._overall, cuda.max_memory_allocated() / 2**20)

    def _begin(self) -> tuple[float, list[float] | None]:
        """The phase's start, and its running peak where CUDA is watched (a phase that starts before CUDA is used
        has none)."""
        cuda = _cuda() if self.synchronize else None
        entry = None
        if cuda is not None:
            cuda.synchronize()
            self._fold(cuda.max_memory_allocated() / 2**20)
            cuda.reset_peak_memory_stats()
            entry = [cuda.memory_allocated() / 2**20]
            self._open.append(entry)
        return time.perf_counter(), entry

    def _end(self, phase: str, opened: tuple[float, list[float] | None]) -> None:
        started, entry = opened
        cuda = _cuda() if self.synchronize else None
        if cuda is not None:
            cuda.synchronize()
            self._fold(cuda.max_memory_allocated() / 2**20)
            cuda.reset_peak_memory_stats()
        if entry is not None:
            self._open = [other for other in self._open if other is not entry]
        self.intervals.append((phase, started, time.perf_counter(), None if entry is None else entry[0]))

    def _fold(self, reading: float) -> None:
        """A peak reading counts for every phase open now, and for the process."""
        for entry in self._open:
            entry[0] = max(entry[0], reading)
        self._overall = max(self._overall, reading)


class _Interval:
    def __init__(self, timer: PhaseTimer, phase: str):
        self.timer, self.phase = timer, phase

    def __enter__(self):
        self.opened = self.timer._begin()

    def __exit__(self, *_):
        self.timer._end(self.phase, self.opened)


def _cuda():
    """torch.cuda where this process has used CUDA, else None (no import of torch, no CUDA initialised here)."""
    torch = sys.modules.get("torch")
    return torch.cuda if torch is not None and torch.cuda.is_initialized() else None
