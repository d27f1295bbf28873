"""HeapTrimmer: one heap trim once a flood of large refused frames is over (server/heap.py)."""

from __future__ import annotations

import asyncio
import sys

import pytest

from hermes.server.heap import TRIM_MIN_BYTES, HeapTrimmer, libc_malloc_trim, resident_bytes

BIG = 4 * 1024 * 1024


class Trim:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> int:
        self.calls += 1
        return 1


async def _until(predicate, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


def test_a_flood_costs_one_trim_once_it_is_over() -> None:
    async def main() -> tuple[int, int]:
        trim = Trim()
        trimmer = HeapTrimmer(0.05, trim=trim)
        # No await between the refusals: the loop cannot fire the timer mid-flood.
        for _ in range(256):
            trimmer.note_refused(BIG)
        during = trim.calls
        await _until(lambda: trimmer.trims == 1)
        await trimmer.close()
        return during, trim.calls

    assert asyncio.run(main()) == (0, 1)


def test_each_flood_gets_its_own_trim() -> None:
    async def main() -> int:
        trim = Trim()
        trimmer = HeapTrimmer(0.02, trim=trim)
        for flood in (1, 2, 3):
            trimmer.note_refused(BIG)
            await _until(lambda f=flood: trimmer.trims == f)
        await trimmer.close()
        return trim.calls

    assert asyncio.run(main()) == 3


@pytest.mark.parametrize("kwargs, size", [
    ({"quiet_s": 0.01}, TRIM_MIN_BYTES - 1),   # small garbage is recycled by the arenas anyway
    ({"quiet_s": 0.0}, BIG),                   # switched off
])
def test_no_trim_for_small_frames_or_when_off(kwargs, size) -> None:
    async def main() -> int:
        trim = Trim()
        trimmer = HeapTrimmer(trim=trim, **kwargs)
        trimmer.note_refused(size)
        armed = trimmer._timer is not None
        await trimmer.close()
        return int(armed) + trim.calls

    assert asyncio.run(main()) == 0


def test_close_cancels_a_pending_trim() -> None:
    async def main() -> int:
        trim = Trim()
        trimmer = HeapTrimmer(0.05, trim=trim)
        trimmer.note_refused(BIG)
        await trimmer.close()
        await asyncio.sleep(0.1)
        return trim.calls

    assert asyncio.run(main()) == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc and /proc")
def test_glibc_trim_and_resident_size_are_real() -> None:
    trim = libc_malloc_trim()
    assert trim is not None and trim() in (0, 1)
    rss = resident_bytes()
    assert rss is not None and rss > 10 * 1024 * 1024
    assert HeapTrimmer().enabled
