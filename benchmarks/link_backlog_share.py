"""The share of a push's backlog that a request sent during the push waits for, on the testbed's shaped links, from
agents traced with ``benchmarks/agent_trace`` (docs/simulation.md; hermes-sim's ``--device-link queue:SHARE``).

    AGENT_TRACE_DIR=DIR PYTHONPATH=benchmarks/agent_trace hermes-bench run benchmarks/suites/sim-calibration.toml \
      --links lte --variants hermes ...
    python benchmarks/link_backlog_share.py DIR... [--push-bytes 434700] [--up 10] [--down 30] [--rtt 0.05]

A hermes agent overlaps its push (its own connection, a thread) with its next cycles, whose prefetcher asks for
work on another connection. Each REQUEST_WORK sent while a push is in flight takes longer than the agent's ones sent
with none (their median): the extra is set against what of the push was still to cross the link when the request
went out, the upload's rest while it goes up, the reply's model while it comes down. The least-squares share
through the origin is what ``queue:SHARE`` charges (1: the whole backlog, first come first served; 0: none).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def points(folder: Path, up_s: float, down_s: float, half_rtt: float) -> list[tuple[float, float, str]]:
    """(seconds of the push still to cross, the request's extra seconds, up or down) for every request during a
    push."""
    out: list[tuple[float, float, str]] = []
    for path in sorted(folder.glob("*.jsonl")):
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        reqs = [x for x in lines if x.get("kind") == "req"]
        pushes = [(x["t0"], x["t"]) for x in reqs if x["type"] == "PUSH_UPDATE"]
        free, busy = [], []
        # The first three requests (pull, validation shards, first work) precede training.
        for x in reqs[3:]:
            if x["type"] != "REQUEST_WORK":
                continue
            during = [p for p in pushes if p[0] <= x["t0"] < p[1]]
            if during:
                busy.append((x["t0"] - during[0][0], x["t"] - x["t0"], during[0][1] - x["t0"]))
            else:
                free.append(x["t"] - x["t0"])
        if not free:
            continue
        alone = statistics.median(free)
        for into, took, to_reply in busy:
            if into < up_s:
                out.append((up_s - into, took - alone, "up"))
            else:
                out.append((min(max(0.0, to_reply - half_rtt), down_s), took - alone, "down"))
    return out


def share(pts: list[tuple[float, float, str]]) -> float:
    den = sum(x * x for x, _, _ in pts)
    return sum(x * y for x, y, _ in pts) / den if den else float("nan")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dirs", nargs="+", type=Path)
    p.add_argument("--push-bytes", type=int, default=434_700, help="a push's message (and its reply's) bytes")
    p.add_argument("--up", type=float, default=10.0, help="Mbit/s up (lte: 10)")
    p.add_argument("--down", type=float, default=30.0, help="Mbit/s down (lte: 30)")
    p.add_argument("--rtt", type=float, default=0.05, help="round trip, s (lte: 0.05)")
    a = p.parse_args(argv)
    up_s, down_s = a.push_bytes * 8 / (a.up * 1e6), a.push_bytes * 8 / (a.down * 1e6)
    pts = [pt for d in a.dirs for pt in points(d, up_s, down_s, a.rtt / 2)]
    by = {d: [pt for pt in pts if pt[2] == d] for d in ("up", "down")}
    print(f"{len(pts)} requests during a push; the share of the push's rest they waited for: {share(pts):.2f} "
          f"(least squares through 0); while it went up {share(by['up']):.2f} ({len(by['up'])}), while the "
          f"model came down {share(by['down']):.2f} ({len(by['down'])})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
