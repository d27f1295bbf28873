"""Prometheus metrics of one server instance (its own registry, so several
servers in one process, as in tests, never share counters)."""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ServerMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.messages = Counter("hermes_messages_total", "Data-plane requests handled", ["type"], registry=r)
        self.errors = Counter("hermes_errors_total", "Data-plane requests answered with an error", ["code"], registry=r)
        self.bytes_in = Counter("hermes_bytes_received_total", "Data-plane bytes received", registry=r)
        self.bytes_out = Counter("hermes_bytes_sent_total", "Data-plane bytes sent", registry=r)
        self.updates = Counter("hermes_updates_total", "Pushed updates by outcome", ["outcome"], registry=r)
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
        self.gate_decisions = Counter(
            "hermes_gate_decisions_total", "Update-gate decisions reported by agents", ["worker", "decision"], registry=r
        )
        self.gate_zscore = Gauge("hermes_gate_last_zscore", "Last gate z-score per worker", ["worker"], registry=r)
        self.worker_cycles = Gauge("hermes_worker_cycles", "Local training cycles per worker", ["worker"], registry=r)
        self.worker_pulls = Gauge("hermes_worker_pulls", "Model pulls per worker", ["worker"], registry=r)
        self.worker_wi = Gauge(
            "hermes_worker_independence", "WI = local cycles / model pulls after the first (Hermes Eq. 7)",
            ["worker"], registry=r,
        )
        self.worker_dss = Gauge("hermes_worker_dataset_size", "Samples per cycle (DSS) assigned", ["worker"], registry=r)
        self.worker_mbs = Gauge("hermes_worker_batch_size", "Mini-batch size (MBS) assigned", ["worker"], registry=r)
        self.worker_cycle_seconds = Gauge(
            "hermes_worker_cycle_seconds", "Compute seconds of the last training cycle", ["worker"], registry=r
        )
        self.stragglers = Counter(
            "hermes_straggler_resizes_total", "Workers resized after IQR outlier detection", ["worker", "kind"], registry=r
        )
        self.test_accuracy = Gauge("hermes_test_accuracy", "Test accuracy of the last evaluated model", registry=r)
        self.test_loss = Gauge("hermes_test_loss", "Test loss of the last evaluated model", registry=r)
        self.evaluated_version = Gauge("hermes_evaluated_version", "Model version of the last evaluation", registry=r)
        self.worker_compute = Gauge("hermes_worker_compute_seconds", "Compute seconds reported", ["worker"], registry=r)
        self.worker_wait = Gauge("hermes_worker_wait_seconds", "Wait seconds reported", ["worker"], registry=r)
        self.worker_samples = Gauge("hermes_worker_samples", "Samples trained, as reported", ["worker"], registry=r)
        self.worker_shard_bytes = Gauge(
            "hermes_worker_shard_bytes", "Shard record bytes fetched, by source (kafka, zmq), as reported",
            ["worker", "source"], registry=r,
        )
        self.worker_prefetch_wait = Gauge(
            "hermes_worker_prefetch_wait_seconds", "Seconds the trainer waited for prefetched shards", ["worker"],
            registry=r,
        )
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

    def render(self) -> bytes:
        return generate_latest(self.registry)
