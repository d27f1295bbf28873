"""Callbacks of a run started from Python: the engine's own facts, handed to the user's code.

The engine reports every fact once through ``Telemetry.emit`` (event log,
metrics, log line) and its subscribers (server/engine/telemetry.py). A
:class:`Dispatcher` is one more subscriber: it queues the facts a callback
can want and calls the callbacks from its own thread, so a slow or failing
callback never holds the data plane or the evaluator. A callback stops the
run with ``server.stop(reason)``.

    class Watch(hermes.Callback):
        def on_evaluation(self, server, evaluation):
            if evaluation["metrics"].get("f1", 0) > 0.95:
                server.stop("f1 is good enough")

    hermes.train(task, callbacks=[Watch()], max_seconds=60)
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Mapping, Sequence
from typing import IO, Any, Protocol


class Server(Protocol):
    """What a callback may do with the run (hermes.api.Server; named here, not imported: api imports this)."""

    def stop(self, reason: str = ...) -> None: ...


# hermes.api.Result (not imported, as Server).
Result = Any

log = logging.getLogger(__name__)

# Facts that end a run by themselves or by request (server/engine/goals.py, core.request_stop).
STOP_FACTS = ("target_reached", "budget_reached", "early_stopped", "stop_requested")


class Callback:
    """Override what you need; every method is called from the dispatcher's thread, one call at a time."""

    # on_model_version is called at most once per this many seconds (the newest version then).
    model_version_interval_s: float = 1.0

    def on_evaluation(self, server: Server, evaluation: Mapping[str, Any]) -> None:
        """A central (or, with ``federated`` True, a federated) evaluation: version, loss, metrics, elapsed."""

    def on_model_version(self, server: Server, version: int) -> None:
        """The global model reached ``version`` (throttled: ``model_version_interval_s``)."""

    def on_stop(self, server: Server, fact: str, fields: Mapping[str, Any]) -> None:
        """The run is stopping: ``fact`` is target_reached, budget_reached, early_stopped or stop_requested."""

    def on_end(self, server: Server, result: Result) -> None:
        """The run is over and everything is shut down; ``result`` is what train() returns."""


class ProgressLine(Callback):
    """One line per evaluation on ``stream`` (train()'s default output, verbose=1)."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream

    def on_evaluation(self, server: Server, evaluation: Mapping[str, Any]) -> None:
        metrics = " ".join(f"{k}={v:.4g}" for k, v in (evaluation.get("metrics") or {}).items())
        prefix = "federated " if evaluation.get("federated") else ""
        self.stream.write(f"hermes: {prefix}eval v{evaluation['version']} {evaluation.get('elapsed', 0.0):.1f}s "
                          f"loss={evaluation['loss']:.4g} {metrics}\n".replace("  ", " "))
        self.stream.flush()

    def on_end(self, server: Server, result: Result) -> None:
        self.stream.write(f"hermes: {result.outcome}: {result.stop_reason}\n")
        self.stream.flush()


_STOP = object()


class Dispatcher:
    """The callbacks' thread: a telemetry subscriber that queues, and a thread that calls."""

    def __init__(self, server: Server, callbacks: Sequence[Callback]) -> None:
        self.server = server
        self.callbacks = list(callbacks)
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._last_version_call = {id(c): float("-inf") for c in self.callbacks}
        self._failed: set[tuple[int, str]] = set()
        self._thread = threading.Thread(target=self._run, name="hermes-callbacks", daemon=True)
        self._thread.start()

    def listener(self, fact: str, fields: Mapping[str, Any]) -> None:
        """Telemetry's subscriber: quick, never raises (it runs on the engine's threads)."""
        if fact in ("evaluation", "federated_evaluation", "update_applied") or fact in STOP_FACTS:
            self._queue.put((fact, dict(fields)))

    def end(self, result: Result) -> None:
        """Deliver what is queued, then on_end, then stop the thread."""
        self._queue.put(("run_over", {"result": result}))
        self._queue.put(_STOP)
        self._thread.join(60.0)

    def close(self) -> None:
        """Stop the thread without on_end (the run never started)."""
        self._queue.put(_STOP)
        self._thread.join(60.0)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            fact, fields = item
            for cb in self.callbacks:
                self._deliver(cb, fact, fields)

    def _deliver(self, cb: Callback, fact: str, fields: dict[str, Any]) -> None:
        try:
            if fact == "evaluation":
                cb.on_evaluation(self.server, fields)
            elif fact == "federated_evaluation":
                cb.on_evaluation(self.server, {**fields, "federated": True})
            elif fact == "update_applied":
                now = time.monotonic()
                if now - self._last_version_call[id(cb)] >= cb.model_version_interval_s:
                    self._last_version_call[id(cb)] = now
                    cb.on_model_version(self.server, int(fields["version"]))
            elif fact == "run_over":
                cb.on_end(self.server, fields["result"])
            else:
                cb.on_stop(self.server, fact, fields)
        except Exception as exc:  # the user's code: any error, reported once per callback and fact
            key = (id(cb), fact)
            if key not in self._failed:
                self._failed.add(key)
                log.warning("callback %s failed on %s: %s: %s (further failures of it are not reported)",
                            type(cb).__name__, fact, type(exc).__name__, exc)
