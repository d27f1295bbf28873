"""Give freed heap back to the OS once a flood of large refused frames is over.

libzmq receives every frame into a ``malloc``'d buffer of its announced size.
glibc serves a large one from its own mapping at first, but once such a
mapping is freed its dynamic mmap threshold rises to that size (up to 32 MiB),
and later frames come from malloc's arenas, which keep what is freed. After a
64-peer burst of 4 MiB frames the server kept +64 to +185 MiB, and later
bursts, on fragmented arenas, peaked higher than the first: a third at +354 MiB in CI
against the 316 MiB the data plane's bound allows (2026-11-27). One
``malloc_trim(0)`` once the refusals stop hands it back: +6 MiB after every
burst, and each burst peaks like the first (+221 to +264 MiB, three bursts in three
servers, 2026-11-27).

Only refused frames arm it: honest pushes are folded and freed in a steady
rhythm, and their buffers are better reused than re-faulted. Setting
``MALLOC_MMAP_THRESHOLD_`` instead makes every large buffer its own mapping,
torch's temporaries included: a 1M-parameter push then took 11.9 ms against
8.3-8.8 ms (`hermes-bench micro --quick`, alternated, 2026-11-27).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import os
from collections.abc import Callable

log = logging.getLogger(__name__)

# glibc's initial mmap threshold: a refused frame at least this big would have been its own
# mapping, given back on free, had the threshold not risen.
TRIM_MIN_BYTES = 128 * 1024


def libc_malloc_trim() -> Callable[[], int] | None:
    """glibc's ``malloc_trim(0)``, or None where the C library has none (musl, macOS)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        trim = libc.malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: int(trim(0))


def resident_bytes() -> int | None:
    """This process's resident set in bytes (Linux), or None."""
    try:
        with open("/proc/self/statm") as fh:
            pages = int(fh.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")


class HeapTrimmer:
    """Trims the heap ``quiet_s`` seconds after the last refused large frame.

    ``note_refused`` is called on the event loop for every refused message;
    each call re-arms one timer, so a flood costs one trim, run in a thread
    once it is over. ``quiet_s=0`` or a C library without ``malloc_trim``
    turns it off.
    """

    def __init__(self, quiet_s: float = 0.5, *, min_bytes: int = TRIM_MIN_BYTES,
                 trim: Callable[[], int] | None = None) -> None:
        self.quiet_s = quiet_s
        self.min_bytes = min_bytes
        self._trim = trim if trim is not None else libc_malloc_trim()
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task | None = None
        self.trims = 0
        if self._trim is None and quiet_s > 0:
            log.debug("no malloc_trim in this C library: freed frame buffers stay with the allocator")

    @property
    def enabled(self) -> bool:
        return self.quiet_s > 0 and self._trim is not None

    def note_refused(self, size: int) -> None:
        if size < self.min_bytes or not self.enabled:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(self.quiet_s, self._start)

    def _start(self) -> None:
        self._timer = None
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="hermes-heap-trim")

    async def _run(self) -> None:
        assert self._trim is not None
        before = resident_bytes()
        released = await asyncio.to_thread(self._trim)
        self.trims += 1
        after = resident_bytes()
        if before is not None and after is not None:
            log.info("flood over: gave %.0f MiB of freed frame buffers back to the OS (resident %.0f MiB)",
                     (before - after) / 2**20, after / 2**20)
        else:
            log.info("flood over: trimmed the heap (released=%d)", released)

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
