"""One ``emit`` per fact: the event log, the Prometheus metrics and the log line.

A fact used to be reported three times by hand (an event, a metric, a log
call), and the three drifted. Here each fact's metric update and log line
are declared once, next to each other; the engine only says what happened.
Series that mirror state (worker counts; per-worker totals, read from the
registry at scrape time by ``metrics.WorkerSeries``) are not facts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from hermes.server.events import EventLog
from hermes.server.metrics import ServerMetrics

log = logging.getLogger("hermes.server.engine")

Fields = Mapping[str, Any]


def _applied(m: ServerMetrics, f: Fields) -> None:
    m.model_version.set(f["version"])
    for staleness in f["staleness"]:
        # Staleness against the model the update was folded into.
        m.staleness.observe(staleness)
        m.updates_applied.inc()


def _evaluation(m: ServerMetrics, f: Fields) -> None:
    if f["accuracy"] is not None:  # a task without an accuracy metric (regression) leaves it unset
        m.test_accuracy.set(f["accuracy"])
    for name, value in (f.get("metrics") or {}).items():
        m.test_metric.labels(metric=name).set(value)
    m.test_loss.set(f["loss"])
    m.evaluated_version.set(f["version"])
    m.eval_seconds.observe(f["seconds"])


_METRICS: dict[str, Callable[[ServerMetrics, Fields], None]] = {
    "update_applied": _applied,
    "update_rejected": lambda m, f: m.updates.labels(outcome="rejected").inc(),
    "evaluation": _evaluation,
    "resize": lambda m, f: m.stragglers.labels(worker=f["name"], worker_id=f["worker"], kind=f["kind"]).inc(),
    "checkpoint": lambda m, f: m.checkpoints.inc(),
    "update_screened_out": lambda m, f: m.screened_out.labels(reason=f["kind"]).inc(),
    "worker_quarantined": lambda m, f: m.quarantined.set(f["quarantined"]),
    "worker_released": lambda m, f: m.quarantined.set(f["quarantined"]),
    "model_restored": lambda m, f: m.model_restores.inc(),
}

_RESIZE_KEYS = ("worker", "name", "kind", "dss", "batch_size", "accumulation")

# fact -> (level, message, arguments from the fields); %-style, formatted only if logged.
_LINES: dict[str, tuple[int, str, Callable[[Fields], tuple[Any, ...]]]] = {
    "stop_requested": (logging.INFO, "stop requested: %s", lambda f: (f["reason"],)),
    "server_shutdown": (logging.INFO, "server shutting down; agents will reconnect to a restarted server",
                        lambda f: ()),
    "target_reached": (logging.INFO, "target %s reached: %s %.4f at model version %d, %.1fs after the start; "
                       "stopping the run",
                       lambda f: (f["target"], f["metric"], f["value"], f["version"], f["seconds"])),
    "budget_reached": (logging.INFO, "%s; stopping the run", lambda f: (f["reason"],)),
    "early_stopped": (logging.INFO, "early stop: %s did not improve on %.4g (version %s) in %d evaluations; "
                      "stopping the run, its best model is the final one",
                      lambda f: (f["metric"], f["best"], f["best_version"], f["patience"])),
    "join": (logging.INFO, "worker %s (%s) %s",
             lambda f: (f["worker"], f["name"], "rejoined" if f["rejoined"] else "joined")),
    "leave": (logging.INFO, "worker %s %s: %s", lambda f: (f["worker"], f["state"], f["reason"])),
    "resize": (logging.INFO, "worker %s resized (%s): dss=%d batch_size=%d accumulation=%d %s",
               lambda f: (f["worker"], f["kind"], f["dss"], f["batch_size"], f["accumulation"],
                          {k: v for k, v in f.items() if k not in _RESIZE_KEYS})),
    "restored_workers_forgotten": (
        logging.INFO, "%d worker(s) of the resumed checkpoint did not register again within %.1fs; "
        "the allocator forgot them: %s", lambda f: (len(f["workers"]), f["timeout"], ", ".join(f["workers"]))),
    "shards_republished": (logging.INFO, "shard records republished to %s (%s)",
                           lambda f: (f["bootstrap"], f["reason"])),
    "shards_republish_failed": (logging.WARNING, "republishing shard records to %s failed: %s",
                                lambda f: (f["bootstrap"], f["error"])),
    "checkpoint": (logging.INFO, "checkpoint at version %d (%s) in %.3fs",
                   lambda f: (f["version"], f["reason"], f["seconds"])),
    "update_screened_out": (logging.INFO, "update from %s refused: %s", lambda f: (f["worker"], f["reason"])),
    "worker_quarantined": (logging.WARNING, "%s", lambda f: (f["reason"],)),
    "worker_released": (logging.WARNING, "worker %s released from quarantine (%s)", lambda f: (f["worker"], f["by"])),
    "model_restored": (logging.ERROR, "model version %d was not finite; restored the model of version %d "
                       "(published as version %d)", lambda f: (f["bad_version"], f["restored"], f["version"])),
    "checkpoint_failed": (logging.ERROR, "%s checkpoint failed: %s", lambda f: (f["reason"], f["error"])),
}


Listener = Callable[[str, Fields], None]


class Telemetry:
    def __init__(self, metrics: ServerMetrics, events: EventLog) -> None:
        self.metrics = metrics
        self.events = events
        # Readers of the same facts outside the engine (the dashboard's history, TensorBoard):
        # they subscribe rather than being called by name, so the engine knows none of them.
        self.listeners: list[Listener] = []

    def subscribe(self, listener: Listener) -> None:
        """Call ``listener(fact, fields)`` after every emit; it must be quick and must not raise."""
        self.listeners.append(listener)

    def emit(self, fact: str, **fields: Any) -> None:
        """Report one fact: its event, its metrics and its log line, whichever it has."""
        self.events.emit(fact, **fields)
        update = _METRICS.get(fact)
        if update is not None:
            update(self.metrics, fields)
        line = _LINES.get(fact)
        if line is not None:
            level, message, args = line
            if log.isEnabledFor(level):
                log.log(level, message, *args(fields))
        for listener in self.listeners:
            listener(fact, fields)
