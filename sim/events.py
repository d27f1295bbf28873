"""The event queue: an asyncio loop whose clock is virtual.

The engine is asyncio code (a barrier holds a push's reply in a future, one
step at a time under a lock, timers for budgets and the start gate), and so
is a device's life in the simulator (send, wait for the reply, train,
push). Rather than a second scheduler beside asyncio's, the loop's own timer
heap is the event queue and its clock is the simulation's:

- ``VirtualLoop.time()`` is the virtual clock; the engine is built with the
  same clock (``VirtualClock``, a ``ManualClock`` that moves forward to a time);
- the selector never sleeps: when nothing is ready it moves the clock to the
  next timer (``asyncio.sleep(s)`` is "s virtual seconds later");
- work the engine would hand to a thread (``offload``, ``asyncio.to_thread``)
  runs inline (``InlineExecutor``), so nothing depends on thread scheduling.

Ordering is deterministic: callbacks run in FIFO order, timers in time order
and, at equal times, by (device, sequence): the device whose coroutine set
the timer (``current_device``, its position in the population; -1, before
every device, for the server's own timers: evaluations, the heartbeat
monitor) and then the order they were scheduled in (one thread, one
sequence of operations for one seed). asyncio's own heap orders equal times
by whatever the heap's sift left, which is deterministic but depends on
every earlier push; (time, device, seq) is a rule a reader can check. When nothing is ready and no timer is
left, every coroutine waits for something that will never come: that is a
simulation bug or a deadlocked policy, and ``Stalled`` says so instead of
hanging.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import heapq
import itertools
import selectors
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from hermes.common.clock import ManualClock

__all__ = ["InlineExecutor", "Stalled", "VirtualClock", "VirtualLoop", "current_device", "run_virtual"]

# The device on whose behalf the running coroutine works (sim.device sets it in each device's task;
# the tasks it starts inherit it): equal-time timers run in device order. -1: the server's own.
current_device: contextvars.ContextVar[int] = contextvars.ContextVar("hermes_sim_device", default=-1)

T = TypeVar("T")


class Stalled(RuntimeError):
    """Nothing is ready and nothing is scheduled: every coroutine waits forever."""


class VirtualClock(ManualClock):
    """The simulation's clock: the engine reads it, the loop moves it."""

    def advance_to(self, t: float) -> None:
        if t > self.monotonic():
            self.advance(t - self.monotonic())


class _VirtualSelector(selectors.BaseSelector):
    """The loop's real selector (its self-pipe) polled without waiting; a wait moves the clock instead."""

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        self.inner = selectors.DefaultSelector()

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self.inner.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self.inner.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self.inner.modify(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = self.inner.select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:
            raise Stalled("the simulation stalled: nothing is ready and nothing is scheduled")
        self.clock.advance(timeout)
        return []

    def close(self) -> None:
        self.inner.close()

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self.inner.get_map()


class InlineExecutor(concurrent.futures.ThreadPoolExecutor):
    """Runs what would go to a worker thread at once, on the caller's thread (deterministic)."""

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # handed to the awaiting coroutine, as a thread's would be
            future.set_exception(exc)
        return future


class _Timer(asyncio.TimerHandle):
    """A timer ordered by (time, device, sequence) in the loop's heap."""

    __slots__ = ("key",)

    def __init__(self, when: float, callback: Callable[..., Any], args: tuple[Any, ...], loop: asyncio.AbstractEventLoop,
                 context: contextvars.Context | None, order: tuple[int, int]) -> None:
        super().__init__(when, callback, args, loop, context)
        # The heap compares timers ~15 times a push at 10,000 devices: one tuple, built once (the
        # comparison was 6% of a profiled 10,000-device run when it built two a call).
        self.key = (when, *order)

    def __lt__(self, other: object) -> bool:
        return self.key < other.key  # type: ignore[attr-defined]  # only _Timers share the heap


class VirtualLoop(asyncio.SelectorEventLoop):
    def __init__(self, clock: VirtualClock) -> None:
        super().__init__(_VirtualSelector(clock))
        self.clock = clock
        self.set_default_executor(InlineExecutor(max_workers=1))
        # asyncio runs the timers due before now + resolution (strictly): a nanosecond, far below
        # any modelled duration and above float rounding at the times a run reaches.
        self._clock_resolution = 1e-9
        self._timer_seq = itertools.count()

    def time(self) -> float:
        return self.clock.monotonic()

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any,  # type: ignore[override]
                context: contextvars.Context | None = None) -> asyncio.TimerHandle:
        """asyncio's call_at (base_events.BaseEventLoop.call_at) with a timer that knows its device and turn."""
        if self.is_closed():
            raise RuntimeError("Event loop is closed")
        device = (context.get(current_device, -1) if context is not None else current_device.get())
        timer = _Timer(when, callback, args, self, context, (device, next(self._timer_seq)))
        heapq.heappush(self._scheduled, timer)  # type: ignore[attr-defined]
        timer._scheduled = True  # type: ignore[attr-defined]
        return timer


def run_virtual(clock: VirtualClock, main: Callable[[], Any]) -> Any:
    """Run the coroutine ``main()`` to completion on a fresh virtual loop; its result."""
    loop = VirtualLoop(clock)
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(main())
    finally:
        try:
            _cancel_pending(loop)
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()


def _cancel_pending(loop: asyncio.AbstractEventLoop) -> None:
    """What is still pending when ``main`` returns (a request a device abandoned as the run stopped: its
    prefetch) is cancelled and run to its end, as ``asyncio.run`` does, instead of destroyed pending (asyncio
    logged "Task was destroyed but it is pending!" after a hermes run without overlap_push)."""
    pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for t in pending:
        t.cancel()
    if pending:
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
