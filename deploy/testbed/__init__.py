"""The testbed run: a heterogeneous cluster of real processes on one machine.

:class:`Testbed` starts a real server (uvicorn, via ``hermes-server``) and N
agent processes on loopback, makes them unequal as an HL profile says,
prints live progress, stops at the target accuracy or the time limit, shuts
everything down (no orphans, ports freed) and writes ``DIR/summary.json``
plus logs and the run's JSON-lines event log. Its command line,
``hermes-testbed`` or ``python -m hermes.deploy.testbed`` (``__main__.py``
here), is in :mod:`hermes.deploy.testbed_cli`; the fault
schedule (``--chaos``) in :mod:`hermes.deploy.testbed_chaos`; the summary
and the progress lines in :mod:`hermes.deploy.testbed_summary`.

The target accuracy is handed to the server (``--target-accuracy``), which
stops the run itself at the evaluation that reached it and keeps that model
(``DIR/model-best.safetensors``); the testbed only watches. Against a server
that does not report an ``outcome`` (an older one) it falls back to
detecting the target in the status and stopping the run through
``/v1/stop``.

Time to target is measured from the moment the agents are launched.

The testbed generates a join token and an admin token for each run and hands
them to the server and the agents through the environment. ``--chaos``
faults are fired by :meth:`Testbed.run_chaos`: an agent SIGKILLed (and
started again later), or the server SIGKILLed and restarted with
``--resume`` from the run's checkpoints; the summary records what was done
and the model version before the kill and after the resume.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hermes.common.atomic_write import write_atomic
from hermes.deploy.links import agent_links
from hermes.deploy.netlab import NetlabError
from hermes.deploy.previous_run import set_aside
from hermes.deploy.procs import Proc, StartupError, free_ports, start, terminate_group, wait_healthy
from hermes.deploy.profiles import (
    PROFILE_CORES,
    heterogeneity_level,
    parse_speed_schedule,
    slowdown_schedules,
    worker_profiles,
)
from hermes.deploy.testbed_chaos import ChurnDriver, check_journal, offline_fractions, parse_chaos, parse_churn
from hermes.deploy.testbed_commands import agent_args, server_command
from hermes.deploy.testbed_links import TestbedLinks
from hermes.deploy.testbed_summary import WorkloadWatch, build_summary, progress_line

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
        # --churn: agents leave and come back all run long (testbed_chaos.ChurnDriver).
        self.churn = (ChurnDriver(parse_churn(args.churn, args.clients, args.max_seconds), stop=self._churn_stop,
                                  start=self._churn_start, version=self._status_version,
                                  finite=not args.churn.strip().startswith("random:"))
                      if getattr(args, "churn", None) else None)
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
        cmd = server_command(a, port=self.port, data_port=self.data_port,
                             advertise_host=self.links.advertise_host, out=self.out,
                             checkpoint_dir=self.checkpoint_dir, kafka_bootstrap=self.kafka_bootstrap,
                             faults_pending=bool(self.chaos) or self._schedule_pending(), resume=resume)
        if self.server is not None:
            self.procs.remove(self.server)
        env = {"HERMES_ADMIN_TOKEN": self.admin_token}
        if getattr(a, "server_threads", None):
            env["OMP_NUM_THREADS"] = str(a.server_threads)  # torch's intra-op threads, read at its import
        self.server = self._spawn("server", cmd, {}, env)
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
        args = agent_args(a, wp, server_url=f"http://{self.links.server_host(wp.index)}:{self.port}",
                          schedules=schedules, schedule_origin=self.agents_started)
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

    def _schedule_pending(self) -> bool:
        """A churn schedule (not the random model) with events still to fire: like --chaos, the
        target counts once they have all fired."""
        churn = getattr(self, "churn", None)
        return churn is not None and churn.finite and bool(churn.pending)

    def _agent_proc(self, index: int) -> Proc:
        return next(p for p in self.agents() if p.name == f"worker-{index}")

    def _churn_stop(self, index: int, sig: str) -> bool:
        agent = self._agent_proc(index)
        if agent.popen.poll() is not None:
            return False
        agent.popen.send_signal(signal.Signals[sig])
        self.emit("churn", action="leave", agent=agent.name, signal=sig)
        return True

    def _churn_start(self, index: int) -> None:
        agent = self._agent_proc(index)
        if agent.popen.poll() is None:
            # Still shutting down after its SIGTERM (a held barrier reply, a slow goodbye).
            agent.popen.kill()
        agent.popen.wait(timeout=10)
        self.procs.remove(agent)
        self.start_agent(agent.info["profile"], agent.info["schedules"])
        self.emit("churn", action="join", agent=agent.name)

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
        churn_t0: float | None = None
        while True:
            elapsed = time.time() - t0
            if self.churn is not None and (status.get("model_version") or 0) >= 1:
                # Churn times count from the first update: the start gate waits for every agent first.
                churn_t0 = elapsed if churn_t0 is None else churn_t0
                self.churn.tick(elapsed - churn_t0)
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
            # On the version just read, not the last loop's: updates can come 30 ms apart, and a
            # fault meant for version 1 fired a poll and a sleep late lands after version 17.
            self.run_chaos(time.time() - t0, status.get("model_version"))
            if reached_at is None:
                reached_at = self._target_reached(status, t0)
                if reached_at is not None:
                    outcome = "target reached"
            if not a.quiet:
                for line in workloads.changes(elapsed, status.get("workloads") or {}):
                    print(line, flush=True)
            if not a.quiet and (time.monotonic() - last_print >= a.progress_interval or reached_at):
                last_print = time.monotonic()
                print(progress_line(elapsed, status, self.agents()), flush=True)
            if reached_at is not None:
                break
            if elapsed >= a.max_seconds:
                outcome = "time limit"
                break
            if all(p.popen.poll() is not None for p in self.agents()) and not (self.churn and self.churn.pending):
                outcome = "all agents exited"
                # The server stops the agents when it reaches the target: they may
                # have exited between the last status poll and this check.
                with contextlib.suppress(urllib.error.URLError, OSError, ValueError):
                    status = self.server_json("/v1/status")
                    reached_at = self._target_reached(status, t0)
                if reached_at is not None:
                    outcome = "target reached"
                elif status.get("budget_reached") or status.get("stopping"):
                    # The server ended the run (a budget, early stop, an operator) and sent the agents home.
                    outcome = f"server stopped: {status.get('stop_reason') or status.get('budget_reached')}"
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
        if reached_at is None and not self.chaos and not self._schedule_pending():
            # The run may have reached its target between the last poll and the agents' exit.
            reached_at = self._target_reached(server_summary, t0)
            if reached_at is not None:
                outcome = "target reached"
        summary = build_summary(
            a, server_summary, outcome=outcome, wall=wall, reached_at=reached_at, t0=t0, agents=self.agents(),
            out=self.out, chaos_log=self.chaos_log,
            server_exit_code=self.server.popen.returncode if self.server else None,
            kafka_bootstrap=self.kafka_bootstrap,
            links=self.links.describe([f"worker-{i + 1}" for i in range(a.clients)]))
        summary["heterogeneity"] = {
            "profile": heterogeneity_level(PROFILE_CORES[a.profile]),
            **(server_summary.get("heterogeneity") or status.get("heterogeneity") or {}),
        }
        summary["workload_changes"] = workloads.log
        if self.churn is not None:
            summary["churn"] = {
                "spec": a.churn, "events": self.churn.log,
                "offline_fraction": offline_fractions(self.churn.log, a.clients,
                                                      wall - churn_t0 if churn_t0 is not None else 0.0),
                "journal": check_journal(self.events_path, self.checkpoint_dir, server_summary.get("model_version"),
                                         server_summary.get("workers") or []),
            }
        write_atomic(self.out / "summary.json", json.dumps(summary, indent=2))
        self.emit("testbed_end", outcome=outcome, final_accuracy=summary["final_accuracy"])
        return summary

    def _target_reached(self, status: dict[str, Any], t0: float) -> float | None:
        """When (wall clock) the run reached the target accuracy, or None if it has not.

        Either time is the wall-clock time of the evaluation that reached the
        target, taken on this machine, so ``reached_at - t0`` measures from
        the agents' launch as documented, whichever path saw it.
        """
        target = self.args.target_accuracy
        if (target is None and self.args.target is None) or self.chaos or self._schedule_pending():
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
