"""deploy/grafana-dashboard.json queries only series the server exports, by the names and labels it uses."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

from hermes.server.metrics import ServerMetrics

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana-dashboard.json"


def _exported() -> tuple[set[str], str]:
    """Every series name /metrics can carry (one worker known), and the rendered text."""
    worker = SimpleNamespace(
        name="edge-a", id="w0001", state="active", cycles=3, pulls=2, pushes=3, samples=384, compute_seconds=1.5,
        wait_seconds=0.2, prefetch_wait_seconds=0.1, messages=9, server_bytes_in=1000, server_bytes_out=2000,
        shard_bytes={"zmq": 4096}, gate_pushes=2, gate_skips=1, workload_history=[(0.0, 128, 32)],
        last_cycle_seconds=0.5, worker_independence=1.5, cycle_log=[(1.0, 128, 32, 0.5, -1.2, True)],
    )
    metrics = ServerMetrics()
    metrics.watch_workers(lambda: [worker])
    # Labelled series appear once a child exists, as on a running server.
    metrics.messages.labels(type="pull_model").inc()
    metrics.errors.labels(code="bad_signature").inc()
    metrics.updates.labels(outcome="applied").inc()
    metrics.limit_hits.labels(limit="max_workers").inc()
    metrics.workers.labels(state="active").set(1)
    metrics.staleness.observe(1)
    text = metrics.render().decode()
    names = set(re.findall(r"^# TYPE (\S+)", text, re.M)) | set(re.findall(r"^([a-zA-Z_:][\w:]*)", text, re.M))
    return names, text


def test_every_query_names_an_exported_series_and_known_labels() -> None:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert len(exprs) >= 15
    names, text = _exported()
    used = {m for e in exprs for m in re.findall(r"\bhermes_\w+", e)}
    assert used <= names, f"the dashboard queries series the server does not export: {sorted(used - names)}"
    # Per-worker panels group by the worker's name, which the server exports beside its id.
    assert 'hermes_worker_samples_total{worker="edge-a",worker_id="w0001"} 384.0' in text
    for e in exprs:
        for labels in re.findall(r"by \(([^)]*)\)", e):
            for label in (x.strip() for x in labels.split(",")):
                assert label == "le" or re.search(rf'[{{,]{label}="', text), (label, e)
    # Running totals are read with rate(): they must be counters.
    for e in exprs:
        for series in re.findall(r"rate\((hermes_\w+?)(?:_bucket)?\{", e):
            assert series.endswith("_total") or f"# TYPE {series} histogram" in text, series
            if series.endswith("_total"):
                assert f"# TYPE {series} counter" in text, series


def test_dashboard_is_importable() -> None:
    dash = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)) and dash["uid"] and dash["schemaVersion"] >= 30
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert {"datasource", "job", "worker"} <= variables
    for p in dash["panels"]:
        assert p["datasource"]["uid"] == "${datasource}" and set(p["gridPos"]) == {"x", "y", "w", "h"}
        assert all(t["datasource"]["uid"] == "${datasource}" for t in p["targets"])
