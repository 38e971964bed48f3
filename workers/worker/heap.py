"""Handing freed heap memory back to the system, when the worker goes idle and at most
every ``interval_s`` under load.

A batch allocates and frees arrays and strings of hundreds of kilobytes. glibc's
allocator raises its mmap threshold after such frees, so later blocks of that size come
from the heap, and the heap keeps what is freed in the middle of it: the worker's RSS then
drifts up by tens of megabytes, more or less by chance, after a large batch or a burst.
``malloc_trim(0)`` returns those free pages (it walks the free heap once); elsewhere than
glibc, :class:`HeapTrimmer` does nothing.

>>> t = HeapTrimmer(interval_s=60.0, clock=lambda: 0.0)
>>> t.after_step(handled=5)      # work done: trimmed at the next idle step or in 60 s
False
>>> t.after_step(handled=0) == t.available   # idle after work: trimmed (where glibc is)
True
>>> t.after_step(handled=0)      # still idle, nothing freed since: not again
False
"""

from __future__ import annotations

import ctypes
import sys
import time
from collections.abc import Callable


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None (another libc, another system)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # musl and others: no malloc_trim
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


_TRIM = _malloc_trim()


class HeapTrimmer:
    """Calls ``malloc_trim(0)`` after the first idle step that follows work, and at most
    every ``interval_s`` seconds while the worker stays busy (0: never under load)."""

    def __init__(self, interval_s: float = 60.0, clock: Callable[[], float] = time.monotonic,
                 ) -> None:
        if interval_s < 0:
            raise ValueError(f"interval_s must be >= 0, got {interval_s}")
        self.interval_s = interval_s
        self.available = _TRIM is not None
        self._clock = clock
        self._dirty = False
        self._last = clock()

    def after_step(self, handled: int) -> bool:
        """Account for one step that handled ``handled`` entries; True if it trimmed."""
        if handled:
            self._dirty = True
            if not self.interval_s or self._clock() - self._last < self.interval_s:
                return False
        elif not self._dirty:
            return False
        return self.trim()

    def trim(self) -> bool:
        """Return free heap pages to the system now; False where that is not available."""
        self._dirty = False
        self._last = self._clock()
        if _TRIM is None:
            return False
        _TRIM(0)
        return True
