#!/usr/bin/env python
"""Start-up to refusal: how long the server, the agent and hermes-deploy take to say no.

    python benchmarks/startup.py [--repeats 5] [--json PATH]

The tests assert what a refusal is (its exit code, one line, nothing
written, no port kept, no registration, torch not imported where it need not
be); how long it takes is measured here instead, because a time bound in a
test fails by chance on a loaded machine (issue 32). Each case runs as users
start it, one process per repeat, the cases interleaved within every repeat
so load from elsewhere hits them alike; the table gives medians of wall and
CPU seconds (the child's user + system time, from ``RUSAGE_CHILDREN``).

Cases:
- ``import torch`` and ``import hermes.client`` in a fresh interpreter;
- the server on a broken task (``task_fixtures.py:vector_loss``): exit 2,
  after importing torch and the app;
- the server on a control port in use: exit 2, before torch;
- the agent on a broken task, against a live server (started once): exit 2;
- the agent on an unreachable server (``--connect-retries 0``): exit 3,
  before torch;
- ``hermes-deploy check`` on a host whose ssh port refuses: exit 1.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hermes.deploy.bench.machine import loadavg, machine_info, print_table
from hermes.deploy.procs import free_ports, start, wait_healthy

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "integration" / "task_fixtures.py"
JOIN_TOKEN = "startup-bench-join-token-0123456789abcdef"
HANG_S = 300.0


def _env() -> dict[str, str]:
    """No HERMES_* from outside (they would change what is refused); the bench's join token."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HERMES_")}
    return {**env, "HERMES_JOIN_TOKEN": JOIN_TOKEN, "PYTHONUNBUFFERED": "1"}


def _timed(cmd: list[str], cwd: Path) -> tuple[int, float, float, str]:
    """(exit code, wall seconds, CPU seconds, last stderr line) of one run to completion."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), cwd=cwd, timeout=HANG_S)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    lines = proc.stderr.strip().splitlines()
    return proc.returncode, wall, cpu, lines[-1] if lines else ""


def _inventory(folder: Path, port: int) -> Path:
    (folder / "known_hosts").write_text("")
    path = folder / "edge.toml"
    path.write_text(f'known_hosts = "{folder / "known_hosts"}"\n\n[[hosts]]\nname = "refused"\nhost = "127.0.0.1"\n'
                    f"port = {port}\nconnect_timeout = 5\n")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", type=Path, help="also write the measurements here")
    args = ap.parse_args(argv)
    py = sys.executable
    started = datetime.now(UTC).isoformat(timespec="seconds")
    load_before = loadavg()
    with tempfile.TemporaryDirectory(prefix="hermes-startup-") as tmp:
        root = Path(tmp)
        port, data_port = free_ports(2)
        server_out = root / "server"
        server_out.mkdir()
        log = server_out / "server.log"
        server = start([py, "-m", "hermes.server.cli", "--host", "127.0.0.1", "--port", str(port), "--data-port",
                        str(data_port), "--task", f"{FIXTURES}:regression", "--out", str(server_out / "out")],
                       log_path=log, env=_env(), cwd=server_out)
        busy = socket.socket()
        try:
            url = f"http://127.0.0.1:{port}"
            wait_healthy(server, url, timeout=HANG_S, log_path=log)
            busy.bind(("127.0.0.1", 0))
            busy.listen()
            (refused_port,) = free_ports(1)  # nothing listens there
            inventory = _inventory(root, refused_port)
            cases: list[tuple[str, int, list[str]]] = [
                ("import torch", 0, [py, "-c", "import torch"]),
                ("import hermes.client", 0, [py, "-c", "import hermes.client"]),
                ("server: broken task", 2,
                 [py, "-m", "hermes.server.cli", "--host", "127.0.0.1", "--port", str(free_ports(1)[0]),
                  "--data-port", "0", "--collective-port", "0", "--insecure", "--out", str(root / "never"),
                  "--task", f"{FIXTURES}:vector_loss"]),
                ("server: control port in use", 2,
                 [py, "-m", "hermes.server.cli", "--host", "127.0.0.1", "--port", str(busy.getsockname()[1]),
                  "--insecure", "--out", str(root / "never")]),
                ("agent: broken task", 2,
                 [py, "-m", "hermes.client.cli", "--server", url, "--name", "broken", "--no-progress",
                  "--task", f"{FIXTURES}:vector_loss"]),
                ("agent: server unreachable", 3,
                 [py, "-m", "hermes.client.cli", "--server", f"http://127.0.0.1:{refused_port}", "--no-progress",
                  "--connect-retries", "0"]),
                ("hermes-deploy check: port refused", 1,
                 [py, "-m", "hermes.deploy.ssh_cli", "check", "-i", str(inventory)]),
            ]
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in cases}
            for _ in range(args.repeats):
                for name, expected, cmd in cases:
                    rc, wall, cpu, line = _timed(cmd, root)
                    if rc != expected:
                        print(f"{name}: exit {rc}, expected {expected}: {line}", file=sys.stderr)
                        return 1
                    runs[name].append({"wall": wall, "cpu": cpu})
        finally:
            busy.close()
            server.terminate()
            server.wait(timeout=60)
    load_after = loadavg()
    rows, medians = [], {}
    for name, samples in runs.items():
        wall = statistics.median(s["wall"] for s in samples)
        cpu = statistics.median(s["cpu"] for s in samples)
        medians[name] = {"wall_seconds": round(wall, 3), "cpu_seconds": round(cpu, 3)}
        rows.append([name, f"{wall:.2f}", f"{cpu:.2f}", f"{min(s['wall'] for s in samples):.2f}",
                     f"{max(s['wall'] for s in samples):.2f}"])
    print_table(f"start-up to refusal, medians of {args.repeats} (load average {load_before} -> {load_after})",
                ["case", "wall s", "CPU s", "min wall", "max wall"], rows)
    if args.json:
        args.json.write_text(json.dumps({"started": started, "repeats": args.repeats, "machine": machine_info(),
                                         "loadavg_before": load_before, "loadavg_after": load_after,
                                         "medians": medians, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
