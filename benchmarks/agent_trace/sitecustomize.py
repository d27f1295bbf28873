"""A diagnostic, not part of hermes: with AGENT_TRACE_DIR set and this folder on PYTHONPATH, every agent process
(``hermes.client`` on its command line) writes a JSON line per data-plane request (its send and reply times,
CLOCK_MONOTONIC, the thread), per cycle end (in flight or not) and per gate judgement, to AGENT_TRACE_DIR/PID.jsonl.

    AGENT_TRACE_DIR=DIR PYTHONPATH=benchmarks/agent_trace hermes-bench run SUITE ...   # HERMES_* is not passed on
    python benchmarks/link_backlog_share.py DIR...

Other processes (the server, the testbed, pytest) are left alone. (docs/simulation.md: the testbed's in-flight
cycles, and the share of a push's backlog a request waits for, 2026-11-28.)
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any


def _cmdline() -> str:
    # sys.argv is not set yet while site runs: the kernel's copy of the command line is.
    try:
        with open("/proc/self/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _install(folder: str) -> None:
    import hermes.client.topology as top
    import hermes.client.transport as tr

    out = open(os.path.join(folder, f"{os.getpid()}.jsonl"), "a", buffering=1)  # noqa: SIM115 - the process's life
    lock = threading.Lock()

    def write(**fields: Any) -> None:
        fields["t"], fields["th"] = time.monotonic(), threading.current_thread().name
        with lock:
            out.write(json.dumps(fields, default=str) + "\n")

    write(kind="argv", argv=_cmdline())
    real_request, real_judge, real_exchange = tr.DataClient.request, top.judge_cycle, top.PushPull._exchange

    def request(self: Any, type_: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = time.monotonic()
        try:
            return real_request(self, type_, *args, **kwargs)
        finally:
            write(kind="req", type=getattr(type_, "name", str(type_)), t0=t0)

    def judge_cycle(job: Any, validation: Any, work: Any, result: Any) -> Any:
        out = real_judge(job, validation, work, result)
        decision = out[1]
        write(kind="judge", decision=None if decision is None else decision.reason,
              push=True if decision is None else decision.push)
        return out

    def exchange(self: Any, work: Any, result: Any) -> Any:
        overlap = self.overlap
        write(kind="cycle_end", inflight=bool(overlap is not None and overlap.pending and not overlap.answered),
              samples=result.samples, compute=result.compute_seconds)
        return real_exchange(self, work, result)

    tr.DataClient.request = request  # type: ignore[method-assign]
    top.judge_cycle = judge_cycle
    top.PushPull._exchange = exchange  # type: ignore[method-assign]


if os.environ.get("AGENT_TRACE_DIR") and "hermes.client" in _cmdline():
    _install(os.environ["AGENT_TRACE_DIR"])
