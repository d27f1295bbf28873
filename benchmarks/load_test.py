"""Load test: many lightweight simulated agents against one real server.

    python benchmarks/load_test.py --agents 64 --seconds 300

Starts ``hermes-server`` (ASP, a small mlp on digits, checkpoints with
durable acks, heartbeats) as a subprocess and runs N simulated agents in
threads of this process. A simulated agent does what a real one does on the
wire, with no training: it registers with the join token, sends heartbeats
from a thread of its own, and loops pull (if newer) / push (an fp16 delta,
signed) / stats report, with a short think time. Prints and writes (``--json``):
pushes/s (client-acknowledged and server-applied), pulls/s, errors (client
exceptions, server error replies, tracebacks in the server log), and the
server's memory: resident set sampled every second, its peak (VmHWM), and
the mean of the first and last fifth of the run, to show it stays bounded.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from machine import loadavg, machine_info, print_table  # noqa: E402

from hermes.client.heartbeat import Heartbeat  # noqa: E402
from hermes.client.transport import ControlClient, DataClient  # noqa: E402
from hermes.common.control_messages import RegisterRequest  # noqa: E402
from hermes.common.signing import ServerClock  # noqa: E402
from hermes.common.wire import MsgType  # noqa: E402
from hermes.deploy.procs import StartupError, free_ports, start, wait_healthy  # noqa: E402

JOIN_TOKEN = secrets.token_urlsafe(32)


def _status(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out


@dataclass
class AgentCounts:
    pushes: int = 0
    pulls: int = 0
    reports: int = 0
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)


def simulated_agent(url: str, name: str, stop: threading.Event, think: float, counts: AgentCounts,
                    seed: int) -> None:
    try:
        control = ControlClient(url, join_token=JOIN_TOKEN, retries=20)
        reg = control.register(RegisterRequest(name=name, threads=1))
        beat = Heartbeat(ControlClient(url, retries=0, timeout=5.0), reg.worker_id, reg.token,
                         interval=reg.heartbeat_interval_seconds, on_lost=lambda reason: stop.set())
        beat.start()
        data = DataClient(reg.data_plane, reg.worker_id, reg.token, timeout=60,
                          clock=ServerClock(reg.server_time_ms), max_message_bytes=reg.max_message_bytes)
        shapes = tuple(tuple(s) for _, s in reg.model_spec["entries"])
        numel = int(reg.model_spec["numel"])
        gen = torch.Generator().manual_seed(seed)
        version = data.request(MsgType.PULL_MODEL, {"dtype": "float32"}).header.model_version
        last_report = time.monotonic()
        while not stop.is_set():
            delta = (torch.randn(numel, generator=gen) * 1e-4).half()
            reply = data.request(MsgType.PUSH_UPDATE, {"samples": 32}, payload=delta, model_version=version,
                                 shapes=shapes, idempotent=False)
            counts.pushes += reply.header.body.get("status") == "applied"
            pulled = data.request(MsgType.PULL_MODEL, {"if_newer": True, "dtype": "float32"}, model_version=version)
            version = pulled.header.model_version
            counts.pulls += 1
            if time.monotonic() - last_report > 5:
                data.request(MsgType.REPORT_STATS, {
                    "samples": counts.pushes * 32, "bytes_sent": data.counter.bytes_sent,
                    "bytes_received": data.counter.bytes_received, "compute_seconds": 0.0, "wait_seconds": 0.0})
                counts.reports += 1
                last_report = time.monotonic()
            if think:
                stop.wait(think)
        beat.stop()
        data.close()
        control.leave(reg.worker_id, reg.token)
    except Exception as exc:  # counted and reported, never silently dropped
        counts.errors += 1
        if len(counts.error_samples) < 3:
            counts.error_samples.append(repr(exc)[:300])


def run(agents: int, seconds: float, think: float, log_dir: Path, hidden: list[int]) -> dict[str, Any]:
    port, data_port = free_ports(2)
    ckpt = log_dir / "checkpoints"
    cmd = [sys.executable, "-m", "hermes.server.cli", "--host", "127.0.0.1", "--port", str(port),
           "--data-host", "127.0.0.1", "--data-port", str(data_port), "--log-level", "warning",
           "--preset", "asp", "--set", "model=mlp", "--set", "model_kwargs=" + json.dumps({"hidden": hidden}),
           "--set", "eval_interval_seconds=5", "--max-workers", str(agents + 8), "--register-rate", "0",
           "--checkpoint-dir", str(ckpt), "--checkpoint-interval", "30",
           "--heartbeat-interval", "2", "--heartbeat-timeout", "20", "--out", str(log_dir / "server")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("HERMES_")} | {
        "HERMES_JOIN_TOKEN": JOIN_TOKEN, "OMP_NUM_THREADS": "1"}
    log_path = log_dir / "server.log"
    server = start(cmd, log_path=log_path, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_healthy(server, url, timeout=120, log_path=log_path, interval=0.2)
        except StartupError as exc:
            raise SystemExit(str(exc)) from None
        base_rss = _status(server.pid)["VmRSS"]
        stop = threading.Event()
        counts = [AgentCounts() for _ in range(agents)]
        threads = [threading.Thread(target=simulated_agent, args=(url, f"sim-{i:03d}", stop, think, counts[i], i),
                                    daemon=True) for i in range(agents)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        samples: list[tuple[float, int]] = []
        while time.monotonic() - t0 < seconds and server.poll() is None:
            samples.append((time.monotonic() - t0, _status(server.pid)["VmRSS"]))
            time.sleep(1.0)
        wall = time.monotonic() - t0
        stop.set()
        for t in threads:
            t.join(timeout=60)
        # After the agents left: every push they counted has had its reply.
        with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
            metrics = r.read().decode()
        peak = _status(server.pid)["VmHWM"]
    finally:
        if server.poll() is None:
            server.terminate()
        server.wait(timeout=60)

    def metric(name: str, **labels: str) -> float:
        want = ",".join(f'{k}="{v}"' for k, v in labels.items())
        pat = re.compile(rf"^{name}{{{re.escape(want)}}} (\S+)$" if labels else rf"^{name} (\S+)$", re.M)
        m = pat.search(metrics)
        return float(m.group(1)) if m else 0.0

    server_errors = {m.group(1): float(m.group(2))
                     for m in re.finditer(r'^hermes_errors_total\{code="([^"]+)"\} (\S+)$', metrics, re.M)}
    log_text = log_path.read_text(errors="replace")
    fifth = max(1, len(samples) // 5)
    first = sum(r for _, r in samples[:fifth]) / fifth
    last = sum(r for _, r in samples[-fifth:]) / fifth
    client_pushes = sum(c.pushes for c in counts)
    return {
        "agents": agents, "seconds": round(wall, 1), "think_seconds": think, "model_hidden": hidden,
        "pushes": client_pushes, "pushes_per_second": round(client_pushes / wall, 1),
        "server_applied": int(metric("hermes_updates_total", outcome="applied")),
        "pulls_per_second": round(sum(c.pulls for c in counts) / wall, 1),
        "heartbeats": int(metric("hermes_heartbeats_total")),
        "checkpoints": int(metric("hermes_checkpoints_total")),
        "workers_lost": int(metric("hermes_workers_lost_total")),
        "client_errors": sum(c.errors for c in counts),
        "client_error_samples": [s for c in counts for s in c.error_samples][:5],
        "server_errors": server_errors,
        "server_tracebacks": log_text.count("Traceback"),
        "server_exit_code": server.returncode,
        "rss_before_agents_mb": round(base_rss / 2**20, 1),
        "rss_first_fifth_mb": round(first / 2**20, 1),
        "rss_last_fifth_mb": round(last / 2**20, 1),
        "peak_rss_mb": round(peak / 2**20, 1),
        "rss_timeline_mb": [[round(t, 1), round(r / 2**20, 1)] for t, r in samples[:: max(1, len(samples) // 60)]],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--agents", type=int, default=64)
    p.add_argument("--seconds", type=float, default=300.0)
    p.add_argument("--think", type=float, default=0.05, help="seconds each agent waits between cycles")
    p.add_argument("--hidden", default="64", help="mlp hidden sizes, comma separated (default 64)")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    print(json.dumps(machine_info()))
    with tempfile.TemporaryDirectory(prefix="hermes-load-") as tmp:
        res = run(args.agents, args.seconds, args.think, Path(tmp), [int(h) for h in args.hidden.split(",")])
    res["loadavg_at_end"] = loadavg()
    print_table(f"load test: {res['agents']} simulated agents, {res['seconds']} s", ["figure", "value"], [
        ["pushes/s (acknowledged)", str(res["pushes_per_second"])],
        ["pushes acknowledged / applied by server", f"{res['pushes']} / {res['server_applied']}"],
        ["pulls/s", str(res["pulls_per_second"])],
        ["heartbeats, checkpoints, workers lost", f"{res['heartbeats']}, {res['checkpoints']}, {res['workers_lost']}"],
        ["errors: client, server replies, tracebacks",
         f"{res['client_errors']}, {int(sum(res['server_errors'].values()))}, {res['server_tracebacks']}"],
        ["server RSS before agents (MB)", str(res["rss_before_agents_mb"])],
        ["server RSS first / last fifth (MB)", f"{res['rss_first_fifth_mb']} / {res['rss_last_fifth_mb']}"],
        ["server peak RSS (MB)", str(res["peak_rss_mb"])],
    ])
    if res["client_error_samples"]:
        print("client errors:", *res["client_error_samples"], sep="\n  ")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    ok = (res["client_errors"] == 0 and not res["server_errors"] and res["server_tracebacks"] == 0
          and res["workers_lost"] == 0)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
