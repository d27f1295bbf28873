"""A bench invocation's CPU demand per role, from ``/proc/PID/stat`` (issue 31's pace rule).

    python benchmarks/cpu_demand.py record --pid BENCH_PID --out demand.jsonl   # beside a hermes-bench run
    python benchmarks/cpu_demand.py report demand.jsonl [--bench-out runs/X]

``record`` samples every descendant of ``--pid`` every ``--interval`` seconds until that process exits: each
one's cumulative user + system CPU (``utime + stime`` of ``/proc/PID/stat``, clock ticks) with its role read from
its command line (agent ``worker-N``, server, ``alone`` (the DDP peer's rank), the testbed process itself, whose
threads are the link relays, or other) and the run folder of the testbed above it (its ``--out``). One JSON line
a sample. Run it at nice 15 outside the bench lock; it costs a few ms of CPU a sample.

``report``: per run, CPU seconds per wall second (cores) of each role over the run's training window, and
their sum: the cluster's from its last agent's join to the evaluation that reached the target (its
``events.jsonl``, with ``--bench-out``), ``alone``'s over its rank's life after start-up (its summary's
``startup_seconds``). A process's CPU in the window is its last sample in it less its last sample before it (0
for a process born in it). Against the machine's cores: the pace rule of docs/compression.md (sixth pass).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from pathlib import Path
from typing import Any

from hl2_alone_breakdown import events as read_events

TICK = os.sysconf("SC_CLK_TCK")
_WORKER = re.compile(r"--name\s+(worker-\d+)")
_OUT = re.compile(r"--out\s+(\S+)")


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds) of ``pid``; None once it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()  # after the command name, which may hold spaces
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def role_of(cmd: str) -> str:
    """What a process is in a bench run, from its command line."""
    if "hermes.client" in cmd or "hermes-client" in cmd:
        m = _WORKER.search(cmd)
        return m.group(1) if m else "agent"
    if "ddp_rank" in cmd:
        return "alone"
    if "uvicorn" in cmd or "hermes.server" in cmd or "hermes-server" in cmd:
        return "server"
    if "hermes.deploy.testbed" in cmd:
        return "testbed"
    return "other"


def record(root: int, out: Path, interval: float) -> None:
    known: dict[int, tuple[str, str | None]] = {}
    with out.open("a") as fh:
        while _stat(root) is not None:
            parents: dict[int, int] = {}
            cpu: dict[int, float] = {}
            for entry in os.listdir("/proc"):
                if entry.isdigit():
                    st = _stat(int(entry))
                    if st is not None:
                        parents[int(entry)], cpu[int(entry)] = st
            # Descendants of root, each with the run folder of its nearest testbed ancestor.
            sample = []
            for pid in cpu:
                if pid == root:
                    continue
                chain, p = [], pid
                while p in parents and p != root and len(chain) < 64:
                    chain.append(p)
                    p = parents[p]
                if p != root:
                    continue
                for q in chain:
                    # Read again until it differs from its parent's: a child seen between fork and exec
                    # still shows the testbed's command line (an agent counted as the testbed, 2026-11-28).
                    if q not in known or known[q][0] == "testbed":
                        cmd = _cmdline(q)
                        m = _OUT.search(cmd) if "hermes.deploy.testbed" in cmd else None
                        known[q] = (role_of(cmd), m.group(1) if m else None)
                run = next((known[q][1] for q in chain if known[q][1]), None)
                sample.append({"pid": pid, "role": known[pid][0], "run": run, "cpu": cpu[pid]})
            fh.write(json.dumps({"t": round(time.time(), 3), "procs": sample}) + "\n")
            fh.flush()
            time.sleep(interval)


def _window(run: str, bench_out: Path | None) -> tuple[float, float] | None:
    """The run's training window, wall-clock epoch seconds (None: not known)."""
    run_dir = Path(run)
    if not run_dir.is_absolute() and bench_out is not None:
        run_dir = bench_out / run
    events = run_dir / "events.jsonl"
    if events.is_file():
        joins, end = [], None
        for e in read_events(events):
            if e.get("event") == "join":
                joins.append(float(e["ts"]))
            elif e.get("event") == "target_reached":
                end = float(e["ts"])
                break
        return (max(joins), end) if joins and end is not None else None
    return None


def demand(samples: list[dict[str, Any]], bench_out: Path | None) -> list[dict[str, Any]]:
    """Per run: cores per role over its training window."""
    by_run: dict[str, list[tuple[float, dict[str, Any]]]] = {}
    for s in samples:
        for p in s["procs"]:
            if p.get("run"):
                by_run.setdefault(p["run"], []).append((s["t"], p))
    rows = []
    for run, points in sorted(by_run.items(), key=lambda kv: kv[1][0][0]):
        window = _window(run, bench_out)
        roles = {p["role"] for _, p in points}
        if window is None and "alone" in roles:
            summary = (bench_out / run if bench_out else Path(run)) / "summary.json"
            life = [t for t, p in points if p["role"] == "alone"]
            startup = None
            if summary.is_file():
                startup = json.loads(summary.read_text()).get("startup_seconds")
            born = min(life)
            window = (born + float(startup or 0.0), max(life))
        if window is None or window[1] <= window[0]:
            continue
        t0, t1 = window
        before: dict[int, float] = {}
        last: dict[int, tuple[str, float]] = {}
        for t, p in points:
            if t <= t0:
                before[p["pid"]] = p["cpu"]
            elif t <= t1:
                last[p["pid"]] = (p["role"], p["cpu"])
        cores: dict[str, float] = {}
        for pid, (role, c) in last.items():
            cores[role] = cores.get(role, 0.0) + (c - before.get(pid, 0.0)) / (t1 - t0)
        rows.append({"run": run, "window_s": round(t1 - t0, 2),
                     "cores": {k: round(v, 3) for k, v in sorted(cores.items())},
                     "total": round(sum(cores.values()), 3)})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("--pid", type=int, required=True)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--interval", type=float, default=0.25)
    rep = sub.add_parser("report")
    rep.add_argument("file", type=Path)
    rep.add_argument("--bench-out", type=Path, default=None)
    a = p.parse_args()
    if a.cmd == "record":
        record(a.pid, a.out, a.interval)
        return
    samples = [json.loads(line) for line in a.file.read_text().splitlines() if line.strip()]
    print("| run | window s | cores by role | total cores |")
    print("| --- | ---: | --- | ---: |")
    for row in demand(samples, a.bench_out):
        roles = ", ".join(f"{k} {v:.2f}" for k, v in row["cores"].items())
        print(f"| {row['run']} | {row['window_s']:.1f} | {roles} | {row['total']:.2f} |")


if __name__ == "__main__":
    main()
