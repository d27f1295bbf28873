"""The command lines ``hermes-testbed`` starts its server and its agents with.

Pure functions of the testbed's arguments (``a``) and what the run chose
(ports, directories, the Kafka broker); :class:`hermes.deploy.testbed.Testbed`
spawns the processes.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from hermes.common.policies.topology import topology_of

if TYPE_CHECKING:
    import argparse

    from hermes.deploy.profiles import WorkerProfile


def server_command(a: argparse.Namespace, *, port: int, data_port: int, advertise_host: str, out: Path,
                   checkpoint_dir: Path, kafka_bootstrap: str | None, faults_pending: bool,
                   resume: bool) -> list[str]:
    """``hermes-server``'s command line; ``faults_pending``: --chaos steps still to fire."""
    cmd = [
        sys.executable, "-m", "hermes.server.cli",
        "--host", "127.0.0.1", "--port", str(port),
        "--data-host", "127.0.0.1", "--data-port", str(data_port),
        "--advertise-host", advertise_host,
        # info: logs/server.log tells the run's story (start, joins, target, stop); at warning an
        # uneventful run left it empty.
        "--preset", a.preset, "--out", str(out), "--log-level", "info",
        "--set", f"dataset={a.dataset}", "--set", f"model={a.model}", "--set", f"seed={a.seed}",
    ]
    if topology_of(a.topology).needs_coordinator:
        cmd += ["--set", "topology=collective", "--set", f"world_size={a.clients}"]
    # The run starts once every agent has registered: a fast agent must not finish a small
    # run before the slow ones have imported torch (an own --set min_workers=... wins).
    cmd += ["--set", f"min_workers={a.clients}"]
    # With faults still to inject the testbed stops the run itself: a server that
    # stopped at its target between two polls would leave them unfired.
    if a.target_accuracy is not None and not faults_pending:
        cmd += ["--target-accuracy", f"{a.target_accuracy:g}"]
    if a.target is not None and not faults_pending:
        cmd += ["--target", a.target]
    if a.task:
        cmd += ["--task", a.task]
    for flag, value in (("--max-epochs", a.max_epochs), ("--max-updates", a.max_updates)):
        if value is not None:
            cmd += [flag, f"{value:g}"]
    # Not --exit-when-done: the testbed owns the cluster's life (it reads the live summary, then
    # stops the server), and a server ending itself raced with agents still starting on a
    # loaded machine (measured: a late agent found no server and exited 3 instead of 0).
    if a.protect_reads:
        cmd.append("--protect-reads")  # the testbed reads with its admin token either way
    if a.screening is not None:
        cmd += ["--screening", a.screening]
    for kv in a.set:
        cmd += ["--set", kv]
    if a.config:
        cmd += ["--config", a.config]
    if kafka_bootstrap:
        cmd += ["--kafka", kafka_bootstrap]
    if a.tensorboard:
        cmd += ["--tensorboard", str(Path(a.tensorboard).resolve())]
    cmd += ["--resume" if resume else "--checkpoint-dir", str(checkpoint_dir),
            "--checkpoint-interval", f"{a.checkpoint_interval:g}",
            "--heartbeat-interval", f"{a.heartbeat_interval:g}", "--heartbeat-timeout", f"{a.heartbeat_timeout:g}"]
    return cmd


def agent_device(a: argparse.Namespace, index: int) -> str:
    """A collective run on ``cuda`` gives each agent its own GPU (nccl refuses two ranks on one)."""
    if a.device == "cuda" and topology_of(a.topology).needs_coordinator:
        return f"cuda:{index}"
    return a.device


def agent_args(a: argparse.Namespace, wp: WorkerProfile, *, server_url: str,
               schedules: list[list[tuple[float, float]]] | None, schedule_origin: float) -> list[str]:
    """The arguments of agent ``wp`` (``hermes.client.cli``), before its link wraps them into a command."""
    args = [
        "--server", server_url, "--name", f"worker-{wp.index + 1}",
        "--threads", str(wp.threads), "--slowdown", f"{wp.slowdown * a.pace:.6g}", "--cores", str(wp.cores),
        "--log-level", "info",
        "--device", agent_device(a, wp.index),
    ]
    if a.task:
        args += ["--task", a.task]
    if getattr(a, "slowdown_mode", "cpu") != "cpu":
        args += ["--slowdown-mode", a.slowdown_mode]
    if getattr(a, "nominal_sample_ms", None) is not None:
        args += ["--nominal-sample-ms", f"{a.nominal_sample_ms:.6g}"]
    if schedules:
        args += ["--slowdown-schedule", ",".join(f"{t:g}:{s * a.pace:.6g}" for t, s in schedules[wp.index]),
                # One clock for every agent, the testbed's: phases line up however long each takes to start.
                "--schedule-origin", f"{schedule_origin:.3f}"]
    return args
