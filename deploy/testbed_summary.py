"""``hermes-testbed``'s account of a run: the summary, its table and the live lines.

:func:`build_summary` turns the server's summary and what the testbed saw
into ``DIR/summary.json``; :func:`format_summary` prints it as the table at
the end of a run. While it runs, :func:`progress_line` and
:class:`WorkloadWatch` print its progress and every change of an agent's
batch (the batch trajectories).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hermes.common.messages import batch_size_of

if TYPE_CHECKING:
    import argparse
    from pathlib import Path

    from hermes.deploy.procs import Proc


def build_summary(a: argparse.Namespace, srv: dict[str, Any], *, outcome: str, wall: float,
                  reached_at: float | None, t0: float, agents: list[Proc], out: Path,
                  chaos_log: list[dict[str, Any]], server_exit_code: int | None, kafka_bootstrap: str | None,
                  links: dict[str, Any]) -> dict[str, Any]:
    """``summary.json``: the testbed's account of the run (``a``: its arguments) beside the server's (``srv``).

    ``agents`` are the agent processes, ``out`` the run directory, ``t0`` when the agents were
    launched and ``reached_at`` when the target was reached (None: not reached); ``links`` is
    how each agent's link was emulated (:meth:`TestbedLinks.describe`).
    """
    by_name = {w["name"]: w for w in srv.get("workers", [])}
    workers = []
    for p in agents:
        w = by_name.get(p.name, {})
        workers.append({
            "id": w.get("id"),
            "name": p.name,
            "speed": round(p.info["speed"], 6),
            "slowdown": round(p.info["slowdown"], 6),
            "cores_emulated": p.info["cores"],
            "threads": p.info["threads"],
            "precision": w.get("precision"),
            "samples": w.get("samples", 0),
            "compute_seconds": w.get("compute_seconds", 0.0),
            "wait_seconds": w.get("wait_seconds", 0.0),
            "prefetch_wait_seconds": w.get("prefetch_wait_seconds", 0.0),
            "prefetch_wait_steady_seconds": w.get("prefetch_wait_steady_seconds", 0.0),
            "data_source": w.get("data_source") or None,
            "shard_bytes_fetched": w.get("shard_bytes_fetched", 0),
            "shard_bytes": w.get("shard_bytes", {}),
            "shard_records": w.get("shard_records", {}),
            "corrupt_records": w.get("corrupt_records", 0),
            "kafka_fallbacks": w.get("kafka_fallbacks", 0),
            "kafka_reconnects": w.get("kafka_reconnects", 0),
            "utilization": w.get("utilization", 0.0),
            "pushes": w.get("pushes", 0),
            "applied": w.get("applied", 0),
            "rejected": w.get("rejected", 0),
            "pulls": w.get("pulls", 0),
            "bytes_sent": w.get("bytes_sent", 0),
            "bytes_received": w.get("bytes_received", 0),
            "collective_bytes": w.get("collective_bytes", 0),
            "messages": w.get("messages", 0),
            "cycles": w.get("cycles", 0),
            "wi": w.get("wi"),
            "gate_pushes": w.get("gate_pushes", 0),
            "gate_skips": w.get("gate_skips", 0),
            "in_flight_cycles": w.get("in_flight_cycles", 0),
            "dss": w.get("dss"),
            "batch_size": batch_size_of(w),
            "accumulation": w.get("accumulation", 1),
            "throughput": w.get("throughput"),
            "workload_history": w.get("workload_history", []),
            "cycle_log_fields": w.get("cycle_log_fields", []),
            "cycle_log": w.get("cycle_log", []),
            "exit_code": p.popen.returncode,
            "log": str(p.log_path.relative_to(out)),
        })
    target = a.target_accuracy
    final_acc = srv.get("final_accuracy")
    # Server restarts (--chaos kill-server): SIGKILL to healthy again, as this launcher saw them.
    downtime = round(sum(c.get("restart_seconds", 0.0) for c in chaos_log if c["action"] == "kill-server"), 3)
    seconds_to_target = None if reached_at is None else round(reached_at - t0, 3)
    return {
        "preset": a.preset,
        "profile": a.profile,
        "clients": a.clients,
        # A --task run trains the task's own data and model: the server names the task, and the
        # built-in dataset/model flags do not apply (None rather than the defaults it never used).
        "task": srv.get("task") or (getattr(a, "task", None) or None),
        "dataset": None if getattr(a, "task", None) else a.dataset,
        "model": None if getattr(a, "task", None) else a.model,
        "speed_schedule": a.speed_schedule or None,
        "pace": a.pace,
        **({"nominal_sample_ms": a.nominal_sample_ms} if getattr(a, "nominal_sample_ms", None) is not None else {}),
        "topology": a.topology,
        "outcome": outcome,
        "wall_seconds": round(wall, 3),
        "target_accuracy": target,
        # The last evaluation, taken at shutdown: updates that were in
        # flight when the target was seen can still move it a little.
        "final_accuracy": final_acc,
        "final_loss": srv.get("final_loss"),
        # The server's best evaluation, whose model it wrote to model-best.safetensors
        # (an older server reports none: the best of its evaluation timeline then).
        "best_accuracy": srv["best_accuracy"] if "best_accuracy" in srv
        else max((e["accuracy"] for e in srv.get("evaluations", [])), default=None),
        "best_version": srv.get("best_version"),
        "best_model_file": srv.get("best_model_file"),
        # The server's own account: target_reached, stopped or running.
        "server_outcome": srv.get("outcome"),
        "target_reached_at": srv.get("target_reached_at"),
        "target": a.target,
        "final_metrics": srv.get("final_metrics"),
        "stop_reason": srv.get("stop_reason"),
        "budget_reached": srv.get("budget_reached"),
        "best_metric": srv.get("best_metric"),
        "best_metrics": srv.get("best_metrics"),
        "reached_target": bool(reached_at is not None
                               and (a.target is not None or (target is not None and final_acc is not None))),
        # Wall-clock seconds from the agents' launch, server downtime included ...
        "seconds_to_target": seconds_to_target,
        # ... and without it: the server's target_reached_at.seconds counts the same way
        # (training seconds; the server's own downtime_seconds and wall_seconds beside them).
        "downtime_seconds": downtime,
        "seconds_to_target_excluding_downtime": None if seconds_to_target is None
        else round(seconds_to_target - downtime, 3),
        "model_updates": srv.get("model_updates", 0),
        "messages_total": srv.get("messages_total", 0),
        "messages_by_type": srv.get("messages_by_type", {}),
        "carried_by_type": srv.get("carried_by_type", {}),
        "bytes_sent_total": sum(w["bytes_sent"] for w in workers),
        "bytes_received_total": sum(w["bytes_received"] for w in workers),
        "epochs": srv.get("epoch_progress"),
        "server_exit_code": server_exit_code,
        "config": srv.get("config"),
        "kafka": None if not kafka_bootstrap else {
            "mode": "auto" if a.kafka == "auto" else "external", "bootstrap": kafka_bootstrap,
        },
        "data_plane": srv.get("data_plane"),
        "shard_bytes_fetched_total": sum(w["shard_bytes_fetched"] for w in workers),
        # The server's count of shard record bytes sent (0 when agents train on local data).
        "shard_bytes": srv.get("shard_bytes"),
        "data_location": srv.get("data_location"),
        "prefetch_wait_seconds_total": round(sum(w["prefetch_wait_seconds"] for w in workers), 6),
        "accuracy_timeline": srv.get("evaluations", []),
        "chaos": chaos_log,
        # How each agent's link was emulated: mode none | kernel | process, and its profile.
        "links": links,
        "resumed_from": srv.get("resumed_from"),
        "workers": workers,
        "events_log": "events.jsonl",
    }


class WorkloadWatch:
    """Turns the server's per-worker workloads into one line per change (batch trajectories, live)."""

    def __init__(self) -> None:
        self.last: dict[str, tuple[int, int, int]] = {}
        self.log: list[dict[str, Any]] = []

    def changes(self, elapsed: float, workloads: dict[str, dict[str, Any]]) -> list[str]:
        lines = []
        for wid, w in sorted(workloads.items()):
            now = (w["dss"], batch_size_of(w), w.get("accumulation", 1))
            before = self.last.get(wid)
            self.last[wid] = now
            if before is None or before == now:
                continue
            self.log.append({"elapsed": round(elapsed, 3), "worker": wid, "name": w.get("name"),
                             "dss": now[0], "batch_size": now[1], "accumulation": now[2]})
            acc = f" accumulation {before[2]} -> {now[2]}" if before[2] != now[2] else ""
            lines.append(f"[testbed {elapsed:6.1f}s] workload {w.get('name', wid)}: batch {before[1]} -> {now[1]}, "
                         f"samples/cycle {before[0]} -> {now[0]}{acc}")
        return lines


def progress_line(elapsed: float, status: dict[str, Any], agents: list[Proc]) -> str:
    ev = status.get("evaluation") or {}
    alive = sum(1 for p in agents if p.popen.poll() is None)
    metric, value = _primary(status, ev.get("metrics"), ev.get("accuracy"))
    label = "acc" if metric == "accuracy" else metric
    return (f"[testbed {elapsed:6.1f}s] version={status.get('model_version', 0):>5} "
            f"{label}={_fmt(value)} loss={_fmt(ev.get('loss'))} "
            f"epochs={status.get('epoch_progress', 0):.2f} agents={alive}/{len(agents)}")


def format_summary(s: dict[str, Any], out: Path) -> str:
    lines = [
        "",
        f"== hermes-testbed: preset={s['preset']} profile={s['profile']} clients={s['clients']} "
        + (f"task={s['task']}" if s.get("task") and s.get("dataset") is None else f"dataset={s['dataset']} model={s['model']}"),
        f"   outcome: {s['outcome']}; wall {s['wall_seconds']:.1f}s; model updates {s['model_updates']}",
        f"   final {_metric_text(s, s.get('final_metrics'), s['final_accuracy'])}, loss {_fmt(s['final_loss'])}; "
        f"best {_metric_text(s, s.get('best_metrics'), s.get('best_accuracy'), name=False)}"
        f"{'' if s.get('best_version') is None else ' at version ' + str(s['best_version'])}"
        f"{' (' + s['best_model_file'] + ')' if s.get('best_model_file') else ''}; "
        f"target {s.get('target') or s['target_accuracy']} {'reached in ' + format(s['seconds_to_target'], '.1f') + 's' if s['reached_target'] else 'not reached'}",
        f"   messages {s['messages_total']}; bytes sent {s['bytes_sent_total'] / 1e6:.2f} MB, "
        f"received {s['bytes_received_total'] / 1e6:.2f} MB",
        f"   {'worker':<10} {'speed':>6} {'samples':>8} {'cycles':>6} {'compute':>8} {'wait':>7} {'util':>5} "
        f"{'push':>5} {'pull':>5} {'WI':>5} {'DSS':>5} {'batch':>5} {'sent MB':>8} {'recv MB':>8} {'exit':>4}",
    ]
    for w in s["workers"]:
        wi = "-" if w.get("wi") is None else f"{w['wi']:.2f}"
        lines.append(
            f"   {w['name']:<10} {w['speed']:>6.2f} {w['samples']:>8} {w['cycles']:>6} {w['compute_seconds']:>7.1f}s "
            f"{w['wait_seconds']:>6.1f}s {w['utilization']:>5.0%} {w['pushes']:>5} {w['pulls']:>5} {wi:>5} "
            f"{str(w['dss']):>5} {str(batch_size_of(w)):>5} {w['bytes_sent'] / 1e6:>8.2f} {w['bytes_received'] / 1e6:>8.2f} "
            f"{str(w['exit_code']):>4}"
        )
    kafka = s.get("kafka") or {}
    lines.append(f"   shard records via {'Kafka ' + kafka['bootstrap'] + ' (' + kafka['mode'] + ')' if kafka else 'the ZeroMQ data plane'}")
    lines.append(f"   {'worker':<10} {'source':>10} {'shard MB':>9} {'kafka MB':>9} {'zmq MB':>7} "
                 f"{'prefetch wait':>13} {'steady':>8} {'corrupt':>7} {'fallbk':>6}")
    for w in s["workers"]:
        by = w.get("shard_bytes") or {}
        lines.append(
            f"   {w['name']:<10} {str(w.get('data_source') or '-'):>10} {w.get('shard_bytes_fetched', 0) / 1e6:>9.2f} "
            f"{by.get('kafka', 0) / 1e6:>9.2f} {by.get('zmq', 0) / 1e6:>7.2f} "
            f"{w.get('prefetch_wait_seconds', 0.0):>12.3f}s {w.get('prefetch_wait_steady_seconds', 0.0):>7.3f}s "
            f"{w.get('corrupt_records', 0):>7} {w.get('kafka_fallbacks', 0):>6}"
        )
    links = s.get("links") or {}
    if links.get("mode", "none") != "none":
        per_agent = ", ".join(f"{n} {a['name']}" for n, a in links["agents"].items())
        lines.append(f"   links ({links['mode']} mode): {per_agent}")
    lines.append(f"   summary: {out / 'summary.json'}   events: {out / 'events.jsonl'}   logs: {out / 'logs'}")
    return "\n".join(lines)


def _primary(s: dict[str, Any], metrics: dict[str, Any] | None, accuracy: Any) -> tuple[str, Any]:
    """The run's primary metric (accuracy, or the task's first metric such as r2) and its value among ``metrics``."""
    metric = s.get("best_metric") or "accuracy"
    return metric, accuracy if metric == "accuracy" else (metrics or {}).get(metric)


def _metric_text(s: dict[str, Any], metrics: dict[str, Any] | None, accuracy: Any, *, name: bool = True) -> str:
    """The primary metric as ``name value`` (or the value alone)."""
    metric, value = _primary(s, metrics, accuracy)
    return f"{metric} {_fmt(value)}" if name else _fmt(value)


def _fmt(v: Any) -> str:
    return "-" if v is None else f"{v:.4f}"
