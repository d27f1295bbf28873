"""A run under attack still reaches its target (issue 15).

Real ``hermes-server`` with its default screening, two honest ``hermes-client``
agents started as users start them, and an attacker: a worker with a valid
join token that registers and pushes poisoned updates through the real data
plane (signed frames on a ZeroMQ DEALER). In one scenario per preset (asp,
bsp, hermes) it sends

1. the first push of the run, before any honest agent has joined: 1000× the
   model's own norm (Hermes' first blend used to have weight 1 whatever it was);
2. once the server has a history of honest norms, a stream of replays of the
   honest global step scaled 3× more each time (1, 3, 9, ...): folded while
   within the bound, refused past it;
3. one update at 1000× the honest median norm, one with a single 3e38 element
   (two of those made the model Inf);
4. an honest-sized push after that burst of refusals: quarantine weighs
   evidence over time and cycles (issue 29), so a burst of seconds may or
   may not quarantine the attacker, but never an honest worker.

Between attacks it pushes zeros, so a barrier preset is never held by it. The
model that has been through the whole attack must reach the target (an
evaluation after the attacker's last push), the refusals must be counted in status and
metrics, and the honest agents must exit 0 having registered once and never
been refused.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from hermes.common.wire import MsgType
from tests.conftest import (
    ADMIN_TOKEN,
    JOIN_TOKEN,
    LiveServer,
    WorkerHandle,
    kill_agents,
    running_server,
    start_agent,
    wait_for,
)

pytestmark = pytest.mark.integration

TARGET = 0.8
# Digits: two honest agents reach 0.8 in 10-25 s on a quiet 2-core machine.
RUN_TIMEOUT_S = 50.0



def _events(srv: LiveServer, kind: str) -> list[dict[str, Any]]:
    lines = (srv.out_dir / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e.get("event") == kind]


class Attacker:
    """A malicious worker: pulls like an agent, pushes what ``plan`` says, records every reply."""

    def __init__(self, srv: LiveServer) -> None:
        self.srv = srv
        self.w: WorkerHandle = srv.register("attacker")
        self.replies: list[tuple[str, str, str]] = []  # (attack, status, reason)
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.previous: torch.Tensor | None = None
        self.direction: torch.Tensor | None = None
        # Blend presets take G = model - w0, not a step: the attacker's step rides on the current model.
        self.blend = self.w.run_config["aggregation"] in ("loss", "fedasync")
        self.w0: torch.Tensor | None = None

    def pull(self) -> tuple[int, torch.Tensor]:
        msg = self.srv.exchange(self.w.frames(MsgType.PULL_MODEL, body={"dtype": "float32"}), timeout=30)
        assert msg.header.type is MsgType.MODEL, msg.header
        assert msg.payload is not None
        flat = msg.payload.flat().clone()
        # The honest global step since the last pull: the direction of the scaled replays.
        if self.previous is not None and float((flat - self.previous).norm()) > 0.0:
            self.direction = (flat - self.previous) / float((flat - self.previous).norm())
        self.previous = flat
        return msg.header.model_version, flat

    def push(self, attack: str, delta: torch.Tensor) -> str:
        """Push ``delta`` from the current model (a barrier holds the reply until its round ends)."""
        version, current = self.pull()
        if self.blend:
            assert self.w0 is not None
            delta = delta + (current - self.w0)
        frames = self.w.frames(MsgType.PUSH_UPDATE, delta, model_version=version, shapes=self.w.shapes,
                               body={"samples": 1})
        msg = self.srv.exchange(frames, timeout=60)
        assert msg.header.type is MsgType.PUSH_REPLY, msg.header
        body = msg.header.body
        self.replies.append((attack, body["status"], body.get("reason", "")))
        if body.get("stop") or body.get("reason") == "run is stopping":
            self.stop.set()
        return body["status"]

    def screening(self) -> dict[str, Any]:
        # Its thresholds (the median norm) are for cluster members: the attacker holds the join token.
        r = self.srv.http.get(self.srv.url + "/v1/status", headers={"Authorization": f"Bearer {JOIN_TOKEN}"})
        assert r.status_code == 200, r.text
        return r.json()["screening"]

    def idle_until(self, predicate, timeout: float) -> None:
        """Push zeros until ``predicate()``: a barrier's round goes on, an asynchronous run is paced by the others."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline or self.stop.is_set():
                raise AssertionError(f"attacker: gave up waiting after {timeout}s")
            self.push("idle", torch.zeros(self.w.numel))
            if self.w.run_config["sync"] != "bsp":  # under a barrier the reply came at the round's end
                version = self.srv.healthz()["model_version"]
                wait_for(lambda v=version: self.heartbeat() > v or self.stop.is_set(), 60, "an honest push")

    def heartbeat(self) -> int:
        """Stay an active worker while waiting (as an agent's heartbeat thread does); the model version."""
        r = self.srv.http.post(f"{self.srv.url}/v1/workers/{self.w.id}/heartbeat",
                               headers={"X-Hermes-Token": self.w.token})
        assert r.status_code == 200, r.text
        return int(r.json()["model_version"])

    def scaled(self, factor: float) -> torch.Tensor:
        median = self.screening()["median_norm"]
        assert median, "no median norm yet"
        direction = self.direction if self.direction is not None else torch.randn(self.w.numel)
        return direction / float(direction.norm()) * median * factor

    def run(self, *, first_push_done: threading.Event) -> None:
        try:
            _, w0 = self.pull()
            self.w0 = w0
            self.push("first", torch.randn(self.w.numel) / (self.w.numel ** 0.5) * float(w0.norm()) * 1000.0)
            first_push_done.set()
            self.idle_until(lambda: (self.screening()["history"] or 0) >= 4 and self.direction is not None, 80)
            for i in range(5):  # 1, 3, 9, 27 are within 32x the median; 81 is not
                self.push(f"scaled x{3 ** i}", self.scaled(3.0 ** i))
                if self.replies[-1][1] == "rejected":
                    break
            self.push("scaled x243", self.scaled(243.0))
            self.push("huge", self.scaled(1000.0))
            element = self.scaled(1.0)
            element[len(element) // 2] = 3e38
            self.push("element", element)
            self.push("scaled x2187", self.scaled(2187.0))
            self.push("after the burst", self.scaled(1.0))
        except BaseException as exc:  # the test reports it; an attacker thread must not die silently
            self.error = exc
        finally:
            first_push_done.set()
            # Gone, as an attacker found out would go: a barrier must not wait for it.
            self.srv.http.post(f"{self.srv.url}/v1/workers/{self.w.id}/leave",
                               headers={"X-Hermes-Token": self.w.token})


def start_attack(srv: LiveServer, attacker: Attacker, names: list[str],
                 tmp_path: Path) -> tuple[threading.Thread, float, list[subprocess.Popen]]:
    """Start the attacker and wait for its first push's reply, then the honest agents (one torch thread
    each, logs in ``tmp_path``): the attacker's thread, the agents' start (monotonic) and the agents."""
    first = threading.Event()
    thread = threading.Thread(target=attacker.run, kwargs={"first_push_done": first}, daemon=True)
    thread.start()
    assert first.wait(30), "the attacker's first push never came back"
    t0 = time.monotonic()
    return thread, t0, [start_agent(srv.url, n, tmp_path / f"{n}.log", "--threads", "1") for n in names]


def attack_then_reach(srv: LiveServer, attacker: Attacker, names: list[str], tmp_path: Path, what: str,
                      target: float = TARGET, hang_s: float = 240.0) -> tuple[dict[str, Any], float]:
    """Start the attacker, then the honest agents; wait for the attack to end and for an evaluation of a
    later model at ``target`` (every honest agent joined by then); stop the run. The status at the target
    and the seconds from the agents' start; every honest agent exited 0 without a traceback, and the
    attacker raised nothing. Shared by the sign-flip and robust-window live tests."""
    thread, t0, agents = start_attack(srv, attacker, names, tmp_path)
    try:
        thread.join(timeout=hang_s)
        assert not thread.is_alive(), ("the attack did not finish", attacker.replies)
        after = srv.healthz()["model_version"]

        def reached() -> dict[str, Any] | None:
            # Every honest agent in the run too: a fast run can reach the target
            # before a slow-starting agent has joined, and the callers count joins.
            if not set(names) <= {e["name"] for e in _events(srv, "join")}:
                return None
            s = srv.get_json("/v1/status")
            ev = s["evaluation"]
            return s if ev and ev["version"] >= after and ev["accuracy"] >= target else None

        # The join and this wait are the hang deadlines; how long the run took is not asserted (issue 32).
        status = wait_for(reached, hang_s, what)
        seconds = time.monotonic() - t0
        r = srv.http.post(srv.url + "/v1/stop", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        assert r.status_code == 200, r.text
        codes = [a.wait(timeout=60) for a in agents]
    finally:
        kill_agents(agents)
    logs = [(tmp_path / f"{n}.log").read_text(errors="replace") for n in names]
    assert codes == [0] * len(names), [log[-2000:] for log in logs]
    assert not any("Traceback" in log for log in logs)
    assert attacker.error is None, (attacker.error, attacker.replies)
    return status, seconds


def _attacked_run(tmp_path: Path, preset: str, *extra: str, honest: int = 2, target: float = TARGET,
                  timeout: float = RUN_TIMEOUT_S * 2) -> None:
    names = [f"honest-{i}" for i in range(honest)]
    # No --target-accuracy: the server would stop the run at the first evaluation over the
    # target, maybe before the attack is over. The target must be reached by a model that
    # has been through the whole attack (an evaluation after the attacker's last push).
    with running_server(tmp_path / "server", "--preset", preset, *extra, sets=("eval_interval_seconds=0.5",)) as srv:
        attacker = Attacker(srv)
        status, _ = attack_then_reach(srv, attacker, names, tmp_path, f"{preset} to reach {target} after the attack",
                                      target=target, hang_s=timeout)
        replies = attacker.replies
        attacks = [r for r in replies if r[0] != "idle"]
        # 1. the first push of the run was the attacker's, and refused as untrusted.
        assert attacks[0][:2] == ("first", "rejected") and "first updates of the run" in attacks[0][2], attacks
        # 2. the scaled stream: folded at first, refused past the bound.
        scaled = [r for r in attacks if r[0].startswith("scaled")]
        assert scaled[0][1] == "applied", scaled
        assert any(r[1] == "rejected" and "× median" in r[2] for r in scaled), scaled
        # 3. huge norm and one huge element refused; 4. nobody honest quarantined.
        by = {r[0]: r for r in attacks}
        assert by["huge"][1] == "rejected", by
        assert by["element"][1] == "rejected", by
        screening = status["screening"]
        assert set(screening["quarantined"]) <= {attacker.w.id}, screening
        assert screening["refusals"]["bootstrap_norm"] == 1
        assert sum(screening["refusals"].values()) >= 5, screening
        assert srv.counter("hermes_screening_refusals_total", reason="bootstrap_norm") == 1
        assert srv.counter("hermes_quarantined_workers") <= 1
        # Nobody honest was refused, and nobody honest registered twice.
        screened = _events(srv, "update_screened_out")
        assert {e["worker"] for e in screened} == {attacker.w.id}, [e for e in screened if e["worker"] != attacker.w.id]
        joins = [e["name"] for e in _events(srv, "join")]
        assert sorted(n for n in joins if n.startswith("honest")) == names, joins
        assert "Traceback" not in srv.log_text()


# hermes in the default suite (26-63 s each here); asp and bsp with -m slow.
@pytest.mark.parametrize("preset", [pytest.param("asp", marks=pytest.mark.slow),
                                    pytest.param("bsp", marks=pytest.mark.slow), "hermes"])
def test_run_reaches_its_target_under_attack(tmp_path, preset):
    _attacked_run(tmp_path, preset)


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["asp", "bsp", "hermes", "ssp", "omnilearn-asp"])
def test_larger_run_reaches_a_higher_target_under_attack(tmp_path, preset):
    # Four honest agents, the README's 0.9: the attacker's refused pushes cost the run nothing it needs.
    _attacked_run(tmp_path, preset, honest=4, target=0.9, timeout=240.0)
