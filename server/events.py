"""The run's JSON-lines event log (joins, updates, evaluations, stop)."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

from hermes.common.clock import SYSTEM_CLOCK, Clock

log = logging.getLogger(__name__)


class EventLog:
    def __init__(self, path: str | Path | None, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._fh = None
        if path is not None:
            p = Path(path)
            p.parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(p, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def emit(self, event: str, **fields: Any) -> None:
        if self._fh is None:
            return
        line = json.dumps({"ts": round(self.clock.time(), 6), "event": event, **fields}, default=str)
        with self._lock:
            try:
                self._fh.write(line + "\n")
                self._fh.flush()
            except (OSError, ValueError):
                log.warning("event log write failed; event %s dropped", event)

    def close(self) -> None:
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None
