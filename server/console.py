"""What the server says on its console: logging set up once, quiet access lines, progress lines.

``configure_logging`` is called by ``hermes-server`` and by ``create_app``
alike; the first call wins, so under ``uvicorn --factory
hermes.server.app:create_app`` (where nobody else gives the root logger a
handler) the hermes lines appear too, in the same format.

Agents heartbeat every few seconds and dashboards poll the status every
second: uvicorn's access log used to be a wall of those. ``QuietAccess``
drops the successful ones (``access_log`` / ``--access-log`` keeps all);
registrations, leaves, stops and every error still get a line.

``Progress`` logs one line per interval from the engine's state: model
version, the latest evaluation, workers, samples per second and, while a
barrier holds replies, whom it waits for::

    progress v42 accuracy 0.9123 loss 0.2871 | 4/4 workers active | 812 samples/s | epoch 1.25
    | barrier v42 waiting for worker-3,worker-4 (2/4)
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import TYPE_CHECKING, Any

from hermes.server.aio import cancel_and_wait

if TYPE_CHECKING:
    from hermes.server.engine import Engine

log = logging.getLogger("hermes.server.progress")

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging(level: str) -> bool:
    """Give the root logger a stderr handler at ``level``, unless something already did.

    Returns whether this call configured it. kafka-python logs every failed
    connection attempt; our retry loops report them once each, so it is
    kept quiet below debug.
    """
    root = logging.getLogger()
    if root.handlers:
        return False
    logging.basicConfig(level=level.upper(), format=FORMAT)
    if level.lower() != "debug":
        logging.getLogger("kafka").setLevel(logging.CRITICAL)
    return True


# Successful requests that come every few seconds from every agent or open dashboard.
_QUIET_PATHS = re.compile(
    r"^/(healthz|metrics|v1/status|v1/workers|v1/history|v1/summary|v1/config|v1/workers/[^/]+/heartbeat"
    r"|ui(/.*)?|favicon\.ico)$")


class QuietAccess(logging.Filter):
    """Drops uvicorn access records of successful heartbeats and status polls."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        # uvicorn's access record: (client, method, path with query, http version, status code).
        if not isinstance(args, tuple) or len(args) != 5:
            return True
        path, status = str(args[2]).split("?", 1)[0], args[4]
        return not (isinstance(status, int) and status < 400 and _QUIET_PATHS.match(path))


def quiet_access_log(enabled: bool) -> None:
    """Install (or remove) the filter on uvicorn's access logger; idempotent."""
    access = logging.getLogger("uvicorn.access")
    for f in [f for f in access.filters if isinstance(f, QuietAccess)]:
        access.removeFilter(f)
    if enabled:
        access.addFilter(QuietAccess())


def _number(v: Any) -> str:
    return f"{v:.4f}" if isinstance(v, float) else str(v)


def barrier_text(engine: Engine) -> str | None:
    """``barrier v12 waiting for w3,w4 (2/4)`` while replies are held, else None.

    Held replies are the pushes a barrier (bsp, ebsp) or a staleness bound
    (ssp) keeps waiting; the workers it waits for are the active ones that
    have not arrived.
    """
    held = set(engine.held)
    if not held:
        return None
    active = engine.registry.active_ids()
    missing = [w for w in active if w not in held]

    def name(wid: str) -> str:
        rec = engine.registry.get(wid)
        return rec.name if rec is not None else wid

    arrived = len([w for w in active if w in held])
    waiting = ",".join(name(w) for w in missing) or "nobody (releasing)"
    return f"barrier v{engine.state.version} waiting for {waiting} ({arrived}/{len(active)})"


class Progress:
    """One progress line per ``interval`` seconds while the server runs."""

    def __init__(self, engine: Engine, interval: float) -> None:
        self.engine = engine
        self.interval = interval
        self._task: asyncio.Task | None = None
        self._last: tuple[float, int] | None = None  # (monotonic time, samples trained by then)

    def _samples(self) -> int:
        return sum(w.samples for w in self.engine.registry.all())

    def line(self, now: float | None = None) -> str:
        """The progress line for the engine's state now (samples/s since the previous line)."""
        e = self.engine
        now = time.monotonic() if now is None else now
        status = e.status()
        parts = [f"v{status['model_version']}"]
        ev = status.get("evaluation")
        if ev:
            parts += [f"{k} {_number(v)}" for k, v in ev.items() if k not in ("version", "at")
                      and isinstance(v, (int, float))]
            if ev.get("version") != status["model_version"]:
                parts.append(f"(evaluated v{ev.get('version')})")
        else:
            parts.append("not evaluated yet")
        out = [" ".join(parts), f"{status['workers_active']}/{status['workers_total']} workers active"]
        samples = self._samples()
        if self._last is not None and now > self._last[0]:
            # A rejoined agent starts its count afresh: never a negative rate.
            out.append(f"{max(0, samples - self._last[1]) / (now - self._last[0]):.0f} samples/s")
        self._last = (now, samples)
        out.append(f"epoch {status['epoch_progress']:.2f}")
        barrier = barrier_text(e)
        if barrier is not None:
            out.append(barrier)
        if status.get("stopping"):
            out.append(f"stopping: {status.get('stop_reason')}")
        return "progress " + " | ".join(out)

    def start(self) -> None:
        if self.interval > 0:
            self._last = (time.monotonic(), self._samples())
            self._task = asyncio.create_task(self._run(), name="hermes-progress")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            if not log.isEnabledFor(logging.INFO):  # --log-level warning (the testbed): nothing to compute
                continue
            try:
                log.info("%s", self.line())
            except Exception:  # a report must never take the server down
                log.exception("progress line failed")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
