"""grpo_kit.memory: the heap memory a step freed goes back to the system only when there is a lot of it, since the
next step pays to fault returned pages in again."""

import platform

import pytest

from grpo_kit import memory


@pytest.mark.parametrize(("free_mib", "trimmed"), [(90, False), (memory.TRIM_ABOVE_MIB + 1, True)])
def test_the_heap_is_trimmed_only_when_it_holds_much_free_memory(monkeypatch, free_mib, trimmed):
    calls = []
    monkeypatch.setattr(memory, "_trim", calls.append)
    monkeypatch.setattr(memory, "_mallinfo2", lambda: memory._MallocInfo(fordblks=free_mib << 20))
    memory.release_freed_memory()
    assert calls == ([0] if trimmed else [])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc statistics")
def test_the_heap_statistics_are_read_from_glibc():
    assert memory._mallinfo2 is not None and memory._mallinfo2().arena > 0
    memory.release_freed_memory()
