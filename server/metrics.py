"""Prometheus metrics of one server instance (its own registry, so several
servers in one process, as in tests, never share counters).

Per-worker series carry the worker's name (``worker``, what people read on a
dashboard) and its id (``worker_id``, stable across a rename and unique):
the registry holds at most ``max_workers`` records, so both stay bounded.
Running totals are counters (``*_total``), so ``rate()`` works on them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ServerMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.messages = Counter("hermes_messages_total", "Data-plane requests handled", ["type"], registry=r)
        self.errors = Counter("hermes_errors_total", "Data-plane requests answered with an error", ["code"], registry=r)
        self.bytes_in = Counter("hermes_bytes_received_total", "Data-plane bytes received", registry=r)
        self.bytes_out = Counter("hermes_bytes_sent_total", "Data-plane bytes sent", registry=r)
        self.updates = Counter("hermes_updates_total", "Pushed updates by outcome", ["outcome"], registry=r)
        # Every fold's series, made once: labels() takes a lock and builds its key a call (issue 31).
        self.updates_applied = self.updates.labels(outcome="applied")
        self.model_version = Gauge("hermes_model_version", "Global model version", registry=r)
        self.workers = Gauge("hermes_workers", "Registered workers by state", ["state"], registry=r)
        self.staleness = Histogram(
            "hermes_update_staleness", "Versions between an update's base and the model it was applied to",
            buckets=(0, 1, 2, 4, 8, 16, 32, 64, 128), registry=r,
        )
        self.apply_seconds = Histogram(
            "hermes_apply_seconds", "Seconds to validate and fold one update (or barrier) into the model",
            buckets=(1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5, 1.0), registry=r,
        )
        self.eval_seconds = Histogram(
            "hermes_eval_seconds", "Seconds per evaluation of the global model",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30), registry=r,
        )
        self.loss_eval_seconds = Histogram(
            "hermes_loss_eval_seconds", "Seconds to score one candidate or global model for loss-weighted aggregation",
            buckets=(1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0), registry=r,
        )
        self.blend_weight = Histogram(
            "hermes_blend_weight", "Share of the worker model in loss-weighted aggregation (Hermes Eq. 5-6)",
            buckets=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0), registry=r,
        )
        # Per-worker series come from WorkerSeries at scrape time; only this one is a fact of its own.
        self.stragglers = Counter(
            "hermes_straggler_resizes_total", "Workers resized after IQR outlier detection",
            ["worker", "worker_id", "kind"], registry=r,
        )
        self.test_accuracy = Gauge("hermes_test_accuracy", "Test accuracy of the last evaluated model", registry=r)
        self.test_metric = Gauge("hermes_test_metric", "Each metric of the task on the last evaluated model",
                                 ["metric"], registry=r)
        self.test_loss = Gauge("hermes_test_loss", "Test loss of the last evaluated model", registry=r)
        self.evaluated_version = Gauge("hermes_evaluated_version", "Model version of the last evaluation", registry=r)
        self.registrations = Counter("hermes_registrations_total", "Registration attempts by outcome", ["outcome"], registry=r)
        self.limit_hits = Counter(
            "hermes_limit_hits_total", "Requests refused by a configured limit (message size, workers, rate)",
            ["limit"], registry=r,
        )
        self.workers_lost = Counter("hermes_workers_lost_total", "Workers marked lost after heartbeat silence", registry=r)
        self.reads_refused = Counter("hermes_reads_refused_total",
                                     "Read requests refused for a missing or wrong token (protect_reads)",
                                     ["endpoint"], registry=r)
        self.heartbeats = Counter("hermes_heartbeats_total", "Control-plane heartbeats received", registry=r)
        self.screened_out = Counter("hermes_screening_refusals_total",
                                    "Pushes refused by update screening, by reason (norm, bootstrap_norm, loss, "
                                    "quarantined)", ["reason"], registry=r)
        self.quarantined = Gauge("hermes_quarantined_workers", "Workers quarantined by update screening",
                                 registry=r)
        self.model_restores = Counter("hermes_model_restores_total",
                                      "Folds that left the model non-finite and were rolled back", registry=r)
        self.checkpoints = Counter("hermes_checkpoints_total", "Checkpoints written", registry=r)

    def watch_workers(self, workers: Callable[[], Iterable[Any]]) -> None:
        """Expose the per-worker series of the records ``workers()`` returns (the registry's)."""
        self.registry.register(WorkerSeries(workers))

    def render(self) -> bytes:
        return generate_latest(self.registry)


# (metric, help, record attribute) of the per-worker running totals: counters.
_TOTALS = (
    ("hermes_worker_cycles", "Local training cycles per worker", "cycles"),
    ("hermes_worker_pulls", "Model pulls per worker", "pulls"),
    ("hermes_worker_pushes", "Updates pushed per worker", "pushes"),
    ("hermes_worker_samples", "Samples trained, as reported", "samples"),
    ("hermes_worker_compute_seconds", "Compute seconds reported", "compute_seconds"),
    ("hermes_worker_wait_seconds", "Wait seconds reported", "wait_seconds"),
    ("hermes_worker_prefetch_wait_seconds", "Seconds the trainer waited for prefetched shards",
     "prefetch_wait_seconds"),
    ("hermes_worker_messages", "Data-plane requests per worker", "messages"),
    ("hermes_worker_bytes_received", "Data-plane bytes the server received from the worker", "server_bytes_in"),
    ("hermes_worker_bytes_sent", "Data-plane bytes the server sent to the worker", "server_bytes_out"),
)


class WorkerSeries(Collector):
    """The registry's per-worker state, read at scrape time.

    These mirror state, not facts: reading them when Prometheus asks keeps one
    source of truth (the worker record) instead of a gauge set beside every
    change, and makes totals counters that are never set backwards.
    """

    def __init__(self, workers: Callable[[], Iterable[Any]]) -> None:
        self.workers = workers

    def collect(self) -> Iterator[Metric]:
        records = list(self.workers())
        labels = ["worker", "worker_id"]
        for name, doc, attr in _TOTALS:
            family = CounterMetricFamily(name, doc, labels=labels)
            for w in records:
                family.add_metric([w.name, w.id], float(getattr(w, attr)))
            yield family
        shard_bytes = CounterMetricFamily("hermes_worker_shard_bytes", "Shard record bytes fetched, by source "
                                          "(kafka, zmq), as reported", labels=[*labels, "source"])
        gate = CounterMetricFamily("hermes_gate_decisions", "Update-gate decisions reported by agents",
                                   labels=[*labels, "decision"])
        gauges = {
            "dss": GaugeMetricFamily("hermes_worker_dataset_size", "Samples per cycle (DSS) assigned", labels=labels),
            "batch_size": GaugeMetricFamily("hermes_worker_batch_size", "Mini-batch size (MBS) assigned", labels=labels),
            "cycle": GaugeMetricFamily("hermes_worker_cycle_seconds", "Compute seconds of the last training cycle",
                                       labels=labels),
            "wi": GaugeMetricFamily("hermes_worker_independence",
                                    "WI = local cycles / model pulls after the first (Hermes Eq. 7)", labels=labels),
            "z": GaugeMetricFamily("hermes_gate_last_zscore", "Last gate z-score per worker", labels=labels),
            "up": GaugeMetricFamily("hermes_worker_active", "1 while the worker is active, else 0", labels=labels),
        }
        for w in records:
            ident = [w.name, w.id]
            for source, nbytes in w.shard_bytes.items():
                shard_bytes.add_metric([*ident, source], float(nbytes))
            if w.gate_pushes or w.gate_skips:
                gate.add_metric([*ident, "push"], float(w.gate_pushes))
                gate.add_metric([*ident, "skip"], float(w.gate_skips))
            if w.workload_history:
                gauges["dss"].add_metric(ident, float(w.workload_history[-1][1]))
                gauges["batch_size"].add_metric(ident, float(w.workload_history[-1][2]))
            if w.cycles:
                gauges["cycle"].add_metric(ident, float(w.last_cycle_seconds))
                gauges["wi"].add_metric(ident, float(w.worker_independence))
            z = w.cycle_log[-1][4] if w.cycle_log else None
            if z is not None:
                gauges["z"].add_metric(ident, float(z))
            gauges["up"].add_metric(ident, 1.0 if w.state == "active" else 0.0)
        yield shard_bytes
        yield gate
        yield from gauges.values()
