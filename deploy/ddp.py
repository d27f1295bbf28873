"""``hermes-testbed --peer ddp``: torch DDP (gloo, torchrun) on the testbed's task, cluster and links.

The peer the bench runs beside our presets. One torchrun with a rank per
agent the testbed would have started; each rank gets the slowdown of that
agent (profile times ``--pace``) and its link. Links: DDP's all-reduce runs
rank to rank inside gloo, where neither the relay nor the connection shim
can reach, and the namespaces would need IP forwarding between them on the
host, so the link is modelled in a DDP communication hook (mode
``modelled``): each all-reduce bucket lasts at least the ring's time on the
slowest link (:func:`hermes.deploy.ddp_rank.link_delay`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hermes.deploy.links import agent_links
from hermes.deploy.procs import free_ports, start, terminate_group
from hermes.deploy.profiles import worker_profiles

log = logging.getLogger(__name__)


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"dataset": args.dataset, "model": args.model, "seed": args.seed}
    for kv in args.set:
        key, _, value = kv.partition("=")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


def run_ddp(args: argparse.Namespace) -> int:
    """Run the DDP peer to completion; write ``OUT/summary.json``; the exit code."""
    out = Path(args.out).resolve()
    (out / "logs").mkdir(parents=True, exist_ok=True)
    (out / "summary.json").unlink(missing_ok=True)
    profiles = worker_profiles(args.profile, args.clients, args.max_threads)
    links = agent_links(args.link, args.links, args.clients)
    link_arg = ",".join(f"{lk.up_bps or 0:g}/{lk.down_bps or 0:g}/{lk.rtt:g}" for lk in links) \
        if any(lk.shaped for lk in links) else ""
    (port,) = free_ports(1)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(args.clients),
           "--master-addr", "127.0.0.1", "--master-port", str(port),
           "-m", "hermes.deploy.ddp_rank", "--out", str(out), "--overrides", json.dumps(_overrides(args)),
           "--slowdowns", ",".join(f"{wp.slowdown * args.pace:.6g}" for wp in profiles),
           "--max-seconds", f"{args.max_seconds:g}"]
    if link_arg:
        cmd += ["--links", link_arg]
    if args.target_accuracy is not None:
        cmd += ["--target-accuracy", f"{args.target_accuracy:g}"]
    if args.ddp_lr is not None:
        cmd += ["--lr", f"{args.ddp_lr:g}"]
    if getattr(args, "slowdown_mode", "cpu") != "cpu":
        cmd += ["--slowdown-mode", args.slowdown_mode]
    if getattr(args, "nominal_sample_ms", None) is not None:
        cmd += ["--nominal-sample-ms", f"{args.nominal_sample_ms:.6g}"]
    if getattr(args, "ddp_eval_every", 20) != 20:
        cmd += ["--eval-every", str(args.ddp_eval_every)]
    if getattr(args, "ddp_hook", "allreduce") != "allreduce":
        cmd += ["--comm-hook", args.ddp_hook, "--powersgd-rank", str(args.ddp_powersgd_rank)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    t0 = time.time()
    proc = start(cmd, log_path=out / "logs" / "ddp.log", env=env, parent_death_signal=signal.SIGTERM)
    try:
        # Start-up (imports, data) on top of the training budget, as the testbed allows its agents.
        code = proc.wait(timeout=args.max_seconds + args.startup_timeout + 60)
    except subprocess.TimeoutExpired:
        log.error("ddp peer ran past its budget; stopping it")
        code = None
    finally:
        terminate_group(proc, grace=10.0)
    summary_path = out / "summary.json"
    if code != 0 and summary_path.is_file():
        # Rank 0 writes the summary after every rank finished training: a failure after it is teardown.
        log.warning("ddp peer exited with %s after writing its summary (see %s)", code, out / "logs" / "ddp.log")
    elif code != 0 or not summary_path.is_file():
        print(f"hermes-testbed: ddp peer failed (exit {code}); see {out / 'logs' / 'ddp.log'}", file=sys.stderr)
        return 1
    summary = json.loads(summary_path.read_text())
    summary.update({"profile": args.profile, "pace": args.pace, "topology": "ddp", "torchrun_exit_code": code,
                    **({"nominal_sample_ms": args.nominal_sample_ms}
                       if getattr(args, "nominal_sample_ms", None) is not None else {}),
                    "wall_seconds_with_startup": round(time.time() - t0, 3),
                    "links": {"mode": "modelled" if link_arg else "none",
                              "agents": {f"rank-{i}": lk.describe() for i, lk in enumerate(links)}}})
    for w, wp in zip(summary["workers"], profiles):
        w["speed"] = wp.speed
    summary_path.write_text(json.dumps(summary, indent=2))
    s = summary
    print(f"== hermes-testbed --peer ddp: {s['clients']} ranks, profile {s['profile']}, lr {s['ddp']['lr']:g}; "
          f"{s['outcome']}; train {s['seconds_to_target'] if s['reached_target'] else '-'} s to target; "
          f"best accuracy {s['best_accuracy']}; summary: {summary_path}")
    return 0
