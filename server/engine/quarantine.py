"""Quarantine: a worker whose updates screening keeps refusing has its later updates refused unread
into the model, until it shows honest updates again or the operator releases it.

Evidence is a score per worker. A refusal by screening adds 1, but only if it
comes ``min_gap_seconds`` after the last refusal that counted and at another
global model version (another cycle of the run): a burst of refusals within
milliseconds is one piece of evidence. The score halves every
``half_life_seconds`` and is multiplied by ``accepted_factor`` by every
accepted update. At ``threshold`` (``screening.quarantine_after``) the
worker is quarantined: the smallest time in which that can happen is
``(threshold - 1) x min_gap_seconds`` of steady refusals (4 s with the
defaults), never one burst.

While quarantined, the worker's updates are still screened but not folded:
``probation`` accepted in a row release it (a refusal starts the count
again and adds evidence); the operator releases it with
``POST /v1/workers/{id}/release`` (admin token). Before issue 29 a worker
refused 5 times in a row was quarantined for good: under ``fedasync`` an
honest worker was, 70 ms after 5 refusals of one burst.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hermes.common.clock import SYSTEM_CLOCK, Clock
from hermes.server.quarantine_params import QuarantineSettings

if TYPE_CHECKING:
    from hermes.server.engine.telemetry import Telemetry
    from hermes.server.registry import WorkerRecord

log = logging.getLogger(__name__)


@dataclass
class Evidence:
    """One worker's record: its decayed score and the last refusal that counted."""

    score: float = 0.0
    at: float = 0.0  # when the score was last brought up to date
    counted: int = 0  # refusals that counted as evidence
    last_counted_at: float | None = None
    last_version: int | None = None
    quarantined_at: float | None = None
    probation_passed: int = 0


class Quarantine:
    def __init__(self, threshold: int, settings: QuarantineSettings, telemetry: Telemetry | None = None, *,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.threshold = threshold
        self.settings = settings
        self.telemetry = telemetry
        self.clock = clock
        self._evidence: dict[str, Evidence] = {}
        self._lock = threading.Lock()
        self.released: dict[str, int] = {"probation": 0, "operator": 0}

    def _decayed(self, ev: Evidence, now: float) -> None:
        # Exponential decay: score x 2^(-dt / half-life).
        ev.score *= 0.5 ** (max(0.0, now - ev.at) / self.settings.half_life_seconds)
        ev.at = now

    def holds(self, worker_id: str) -> bool:
        ev = self._evidence.get(worker_id)
        return ev is not None and ev.quarantined_at is not None

    def score(self, worker_id: str) -> float:
        with self._lock:
            ev = self._evidence.get(worker_id)
            if ev is None:
                return 0.0
            self._decayed(ev, self.clock.monotonic())
            return ev.score

    def refused(self, worker: WorkerRecord, version: int) -> bool:
        """Screening refused this worker's update at model ``version``; True when that quarantines it."""
        s = self.settings
        now = self.clock.monotonic()
        with self._lock:
            ev = self._evidence.setdefault(worker.id, Evidence(at=now))
            ev.probation_passed = 0
            self._decayed(ev, now)
            if ev.last_counted_at is not None and (now - ev.last_counted_at < s.min_gap_seconds
                                                   or version == ev.last_version):
                return False  # the same burst, or the same cycle: already counted
            ev.score += 1.0
            ev.counted += 1
            ev.last_counted_at, ev.last_version = now, version
            if ev.quarantined_at is not None or not self.threshold or ev.score < self.threshold:
                return False
            ev.quarantined_at = now
            score, counted = ev.score, ev.counted
            quarantined = sum(e.quarantined_at is not None for e in self._evidence.values())
        worker.quarantined = True
        if self.telemetry is not None:
            self.telemetry.emit("worker_quarantined", worker=worker.id, refusals=counted, score=round(score, 3),
                                quarantined=quarantined,
                                reason=self.reason(worker.id))
        return True

    def accepted(self, worker: WorkerRecord) -> str | None:
        """Screening accepted this worker's update: None when it may be folded, else why not
        (the worker is quarantined and still on probation)."""
        now = self.clock.monotonic()
        with self._lock:
            ev = self._evidence.get(worker.id)
            if ev is None:
                return None
            self._decayed(ev, now)
            if ev.quarantined_at is None:
                ev.score *= self.settings.accepted_factor
                return None
            ev.probation_passed += 1
            need = self.settings.probation
            if not need or ev.probation_passed < need:
                return (f"worker {worker.id} is quarantined; this update passed screening "
                        f"({ev.probation_passed}/{need or 'operator release'} needed for release) and is not applied")
        self._release(worker, "probation")
        return None

    def release(self, worker: WorkerRecord, by: str = "operator") -> bool:
        """Release a quarantined worker (False: it was not quarantined)."""
        if not self.holds(worker.id):
            return False
        self._release(worker, by)
        return True

    def _release(self, worker: WorkerRecord, by: str) -> None:
        with self._lock:
            # A clean slate: the evidence that quarantined it was answered.
            self._evidence[worker.id] = Evidence(at=self.clock.monotonic())
            self.released[by] = self.released.get(by, 0) + 1
            quarantined = sum(e.quarantined_at is not None for e in self._evidence.values())
        worker.quarantined = False
        if self.telemetry is not None:
            self.telemetry.emit("worker_released", worker=worker.id, by=by, quarantined=quarantined)

    def reason(self, worker_id: str) -> str:
        """What a quarantined worker is told with each refused update."""
        ev = self._evidence.get(worker_id)
        counted = ev.counted if ev is not None else 0
        passed = ev.probation_passed if ev is not None else 0
        need = self.settings.probation
        release = (f"{need} updates in a row that pass screening release it ({passed} so far)" if need
                   else "only the operator can release it")
        return (f"worker {worker_id} is quarantined after {counted} refused updates over time "
                f"(evidence score >= {self.threshold}); {release}")

    def quarantined(self) -> list[str]:
        return sorted(w for w, e in self._evidence.items() if e.quarantined_at is not None)

    def public(self) -> dict[str, Any]:
        return {"quarantined": self.quarantined(), "released": dict(self.released)}
