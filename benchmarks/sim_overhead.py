"""Side-by-side micro-runs of two per-event costs cut for 10,000 simulated devices (docs/simulation.md, "10,000 devices").

    python benchmarks/sim_overhead.py [SUMMARY_JSON]

1. the virtual loop's timer heap: 20,000 timers, then 40,000 pops and pushes, with the earlier comparison
   (a ``(when(), order)`` tuple built per comparison) and ``hermes.sim.events._Timer`` (one key per timer);
2. a summary with one entry per worker written by ``json.dumps(indent=2)`` and by ``hermes.common.readable_json``
   (SUMMARY_JSON, e.g. a 10,000-device run's summary.json; skipped without it).
Medians of repeats, in one process; say the load beside the figures.
"""

from __future__ import annotations

import asyncio
import heapq
import json
import random
import statistics
import sys
import time
from typing import Any

from hermes.common import readable_json
from hermes.sim.events import _Timer


class _TupleTimer(asyncio.TimerHandle):
    """The earlier timer: two tuples built per comparison."""

    __slots__ = ("order",)

    def __init__(self, when: float, cb: Any, args: tuple[Any, ...], loop: Any, ctx: Any, order: tuple[int, int]) -> None:
        super().__init__(when, cb, args, loop, ctx)
        self.order = order

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, _TupleTimer):
            return NotImplemented
        return (self.when(), self.order) < (other.when(), other.order)


def heap_seconds(cls: Any, whens: list[float], loop: asyncio.AbstractEventLoop) -> float:
    heap: list[Any] = []
    t0 = time.perf_counter()
    for i, w in enumerate(whens[:20_000]):
        heapq.heappush(heap, cls(w, print, (), loop, None, (i % 1000, i)))
    for i, w in enumerate(whens[20_000:]):
        heapq.heappop(heap)
        heapq.heappush(heap, cls(w, print, (), loop, None, (i % 1000, i)))
    return time.perf_counter() - t0


def main(argv: list[str]) -> int:
    loop = asyncio.new_event_loop()
    rng = random.Random(0)
    whens = [rng.random() * 100 for _ in range(60_000)]
    old = statistics.median(heap_seconds(_TupleTimer, whens, loop) for _ in range(5))
    new = statistics.median(heap_seconds(_Timer, whens, loop) for _ in range(5))
    print(f"timer heap: tuple per comparison {old:.3f} s, one key {new:.3f} s, ratio {old / new:.2f} (medians of 5)")
    if argv:
        summary = json.loads(open(argv[0]).read())
        a, b = [], []
        for _ in range(3):
            t0 = time.perf_counter()
            json.dumps(summary, indent=2)
            a.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            readable_json.dumps(summary)
            b.append(time.perf_counter() - t0)
        print(f"summary: indent=2 {statistics.median(a):.2f} s, readable_json {statistics.median(b):.2f} s, "
              f"ratio {statistics.median(a) / statistics.median(b):.1f} (medians of 3)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
