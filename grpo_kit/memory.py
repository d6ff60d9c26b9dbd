"""Handing the memory a training step freed back to the operating system.

glibc's malloc keeps freed heap memory for reuse, and the large, short-lived tensors of a step on the CPU (the
activations of a forward pass) leave its heap fragmented: measured on 64 completions of 512 tokens, a run's resident
memory grew by 700 MiB over 4 steps, and its peak by 500 MiB, with 6 MiB of tensors alive between steps.
`malloc_trim` returns the free pages at the end of each step. Elsewhere (macOS, musl) there is nothing to call.
"""

import ctypes
import sys

_trim = getattr(ctypes.CDLL(None), "malloc_trim", None) if sys.platform.startswith("linux") else None


def release_freed_memory() -> None:
    if _trim is not None:
        _trim(0)
