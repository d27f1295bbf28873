"""The attack families of issue 29 beyond sign flips and lying claims, as timed runs (issue 29's "Must show").

Each ``*_run(tmp_path, preset, attack)`` is one run of ``benchmarks/attack_matrix.py``: a real
``hermes-server`` with its defaults, three honest ``hermes-client`` agents on digits, and, with
``attack=True``, an attacker holding only the join token (the journal's "attacker" is a flipped bit).
``attack=False`` is the same run with the attack switched off, the honest run of the 1.5x rule. Both are
timed alike: from the honest agents' start to the first evaluation at or above the target of a model made
after the attack began, the attack going on until then. Every run checks that no honest worker was refused
or quarantined and that every honest agent exited 0, plus its own suite's checks:

- ``takeover``: the attacker registers every honest agent's name, bare, with a made-up name key, and
  with a key and an instance hint, every second of the run; each attempt must be refused (409) and the
  names keep their ids. A registration that got through would push five huge updates under the id.
- ``barrier`` (bsp): a silent worker (heartbeats, never pushes) and a failing one (every push draws an
  error reply) from the run's start; their replies must all be errors and rounds must go on without them.
- ``sybils``: once the honest agents have joined, 256 registrations from one join token as fast as the
  wire allows (``--register-rate 0``: as from many source addresses); the admitted Sybils take turns
  pushing sign flips at k = 10, one every 8 honest pushes, from the first admitted one on (the flood goes
  on beside them). Registrations past the cap are refused with Retry-After. Without the attack: one worker pushes zeros at the same pace.
- ``journal``: at model version 20 the server is killed (SIGKILL) and resumed at the same ports; with
  the attack one bit in the middle of the journal is flipped first, the resume refuses with one line and
  the count it would lose (exit 2), and the operator resumes with ``--resume-truncate-corrupt``.

The default suite runs each family's attacked run once (``test_*``); the 1.5x ratios are measured by
``benchmarks/attack_matrix.py`` (docs/security-screening.md): timings are not asserted (docs/testing.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from hermes.common.wire import MsgType
from tests.conftest import (
    ADMIN_TOKEN,
    JOIN_TOKEN,
    LiveServer,
    WorkerHandle,
    _server_env,
    kill_agents,
    running_server,
    wait_for,
)
from tests.integration.test_attack_live import _events
from tests.integration.test_signflip_live import SignFlipper

pytestmark = pytest.mark.integration

TARGET = 0.8
HANG_S = 300.0
HONEST = [f"honest-{i}" for i in range(3)]
KILL_AT = 20  # journal: the model version at which the server is killed


def _agent(url: str, name: str, log: Path, state: Path) -> subprocess.Popen:
    """A hermes-client as users start it, its name key in ``state`` (test_trust_live's)."""
    env = {**os.environ, "HERMES_JOIN_TOKEN": JOIN_TOKEN, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
           "HERMES_AGENT_STATE": str(state)}
    with open(log, "wb") as fh:
        return subprocess.Popen([sys.executable, "-m", "hermes.client.cli", "--server", url, "--name", name,
                                 "--no-progress", "--threads", "1"], stdout=fh, stderr=subprocess.STDOUT, env=env)


def _honest_ids(srv: LiveServer) -> dict[str, str]:
    return {w["name"]: w["id"] for w in srv.get_json("/v1/workers") if w["name"] in HONEST}


def _reached_after(srv: LiveServer, version: Callable[[], int], what: str) -> tuple[dict[str, Any], float]:
    """The status at the first evaluation >= TARGET of a model past ``version()`` with every honest agent in
    the run (after a resume they register again: the checks below judge all three); the monotonic time then."""
    def reached() -> dict[str, Any] | None:
        if len(_honest_ids(srv)) < len(HONEST):
            return None
        s = srv.get_json("/v1/status")
        ev = s["evaluation"]
        return s if ev and ev["version"] > version() and ev["accuracy"] >= TARGET else None

    status = wait_for(reached, HANG_S, what)
    return status, time.monotonic()


def _stop_and_check(srv: LiveServer, agents: list[subprocess.Popen], tmp_path: Path,
                    attackers: set[str]) -> dict[str, Any]:
    """Stop the run; every honest agent exited 0, none refused or quarantined. The screening section."""
    r = srv.http.post(srv.url + "/v1/stop", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert r.status_code == 200, r.text
    codes = [a.wait(timeout=60) for a in agents]
    logs = [(tmp_path / f"{n}.log").read_text(errors="replace") for n in HONEST]
    assert codes == [0] * len(HONEST), [log[-2000:] for log in logs]
    r = srv.http.get(srv.url + "/v1/status", headers={"Authorization": f"Bearer {JOIN_TOKEN}"})
    assert r.status_code == 200, r.text
    screening = r.json()["screening"]
    honest = set(_honest_ids(srv).values())
    assert len(honest) == len(HONEST), srv.get_json("/v1/workers")
    refused = {e["worker"] for e in _events(srv, "update_screened_out")} & honest
    assert not refused, (refused, screening)
    assert not set(screening["quarantined"]) & honest, screening
    assert not set(screening["quarantined"]) - attackers, screening
    assert "Traceback" not in srv.log_text()
    return screening


def _result(suite: str, preset: str, attack: bool, t0: float, at: float, status: dict[str, Any],
            screening: dict[str, Any], tmp_path: Path, **extra: Any) -> dict[str, Any]:
    result = {"suite": suite, "preset": preset, "attack": attack, "seconds_to_target": round(at - t0, 1),
              "accuracy": status["evaluation"]["accuracy"], "refusals": screening["refusals"], **extra}
    (tmp_path / f"{suite}.json").write_text(json.dumps(result))
    print(json.dumps(result))
    return result


def _register(srv: LiveServer, name: str, **fields: Any) -> httpx.Response:
    return srv.http.post(srv.url + "/v1/workers/register", json={"name": name, **fields},
                         headers={"Authorization": f"Bearer {JOIN_TOKEN}"})


# ---------------------------------------------------------------------------------------------------------------
# name takeover


def takeover_run(tmp_path: Path, preset: str = "asp", attack: bool = True) -> dict[str, Any]:
    with running_server(tmp_path / "server", "--preset", preset) as srv:
        state = tmp_path / "state"
        t0 = time.monotonic()
        agents = [_agent(srv.url, n, tmp_path / f"{n}.log", state) for n in HONEST]
        stop = threading.Event()
        attempts: list[int] = []
        errors: list[BaseException] = []

        def take_names() -> None:
            # The attack: the honest name without an instance hint; then with a key of its own.
            variants = ({}, {"name_key": "x" * 43}, {"name_key": "x" * 43, "hints": {"instance": "ab" * 8}})
            try:
                while not stop.is_set():
                    for name in HONEST:
                        for fields in variants:
                            r = _register(srv, name, **fields)
                            attempts.append(r.status_code)
                            if r.status_code == 200:  # taken over: five huge pushes under the honest id
                                w = WorkerHandle(server=srv, id=r.json()["worker_id"], token=r.json()["token"],
                                                 name=name, model_spec=r.json()["model_spec"],
                                                 run_config=r.json()["run_config"])
                                for _ in range(5):
                                    v, _ = w.pull()
                                    w.push(1e4 * torch.ones(w.numel) / w.numel ** 0.5, base_version=v)
                    stop.wait(1.0)  # scenario pacing: an attempt a second per name and variant
            except BaseException as exc:  # reported by the run
                errors.append(exc)

        thread = threading.Thread(target=take_names, daemon=True)
        try:
            ids = wait_for(lambda: (lambda m: m if len(m) == len(HONEST) and all(
                srv.workers()[i]["applied"] >= 1 for i in m.values()) else None)(_honest_ids(srv)), HANG_S,
                "every honest agent's first applied push")
            after = srv.healthz()["model_version"]
            if attack:
                thread.start()
            status, at = _reached_after(srv, lambda: after, f"{preset} to reach {TARGET} past name takeovers")
            stop.set()
            if attack:
                thread.join(timeout=60)
            screening = _stop_and_check(srv, agents, tmp_path, attackers=set())
        finally:
            stop.set()
            kill_agents(agents)
        assert not errors, errors
        assert _honest_ids(srv) == ids, (_honest_ids(srv), ids)
        if attack:
            assert attempts and set(attempts) == {409}, attempts
        return _result("takeover", preset, attack, t0, at, status, screening, tmp_path,
                       takeover_attempts=len(attempts), refused_409=attempts.count(409))


# ---------------------------------------------------------------------------------------------------------------
# silent and failing workers at a barrier


def barrier_run(tmp_path: Path, preset: str = "bsp", attack: bool = True) -> dict[str, Any]:
    with running_server(tmp_path / "server", "--preset", preset) as srv:
        stop = threading.Event()
        errors: list[BaseException] = []
        failing_replies: list[str] = []
        bad: list[WorkerHandle] = []
        threads: list[threading.Thread] = []
        if attack:
            silent, failing = srv.register("silent"), srv.register("failing")
            bad = [silent, failing]

            def heartbeats() -> None:
                while not stop.wait(1.0):
                    for w in bad:
                        srv.http.post(f"{srv.url}/v1/workers/{w.id}/heartbeat", headers={"X-Hermes-Token": w.token})

            def fail() -> None:
                try:
                    while not stop.wait(0.5):  # scenario pacing: a wrong-shaped push every half second
                        msg = srv.exchange(failing.frames(MsgType.PUSH_UPDATE, torch.zeros(failing.numel + 1),
                                                          model_version=0, shapes=((failing.numel + 1,),),
                                                          body={"samples": 1}))
                        failing_replies.append(msg.header.type.value)
                except BaseException as exc:  # reported by the run
                    errors.append(exc)

            threads = [threading.Thread(target=heartbeats, daemon=True), threading.Thread(target=fail, daemon=True)]
            for t in threads:
                t.start()
        t0 = time.monotonic()
        agents = [_agent(srv.url, n, tmp_path / f"{n}.log", tmp_path / "state") for n in HONEST]
        try:
            status, at = _reached_after(srv, lambda: 0, f"{preset} to reach {TARGET} past silent and failing workers")
            stop.set()
            screening = _stop_and_check(srv, agents, tmp_path, attackers={w.id for w in bad})
        finally:
            stop.set()
            kill_agents(agents)
        for t in threads:
            t.join(timeout=60)
        assert not errors, errors
        if attack:
            assert failing_replies and set(failing_replies) == {"error"}, failing_replies
            assert srv.workers()[bad[0].id]["pushes"] == 0
        releases = srv.log_text().count("round released without worker")
        return _result("barrier", preset, attack, t0, at, status, screening, tmp_path,
                       failing_pushes=len(failing_replies), deadline_releases=releases,
                       version=status["evaluation"]["version"])


# ---------------------------------------------------------------------------------------------------------------
# Sybils


class SybilFlipper(SignFlipper):
    """A SignFlipper that, once the honest agents have joined, registers ``flood`` names and takes turns
    pushing its flips under each admitted id: the evidence against any one id stays thin."""

    def __init__(self, srv: LiveServer, k: float, flood: int) -> None:
        super().__init__(srv, k, None)
        self.flood = flood
        self.codes: list[int] = []
        self.retry_after: list[str] = []
        self.ids = [self.w]
        self.turn = 0
        self.beaten = 0.0

    def heartbeat(self) -> int:
        """Every Sybil stays active (the server forgets a worker silent for 30 s), at most every 5 s."""
        if time.monotonic() - self.beaten > 5.0:
            self.beaten = time.monotonic()
            for w in self.ids:
                self.srv.http.post(f"{self.srv.url}/v1/workers/{w.id}/heartbeat", headers={"X-Hermes-Token": w.token})
        return super().heartbeat()

    def honest_pushes(self) -> int:
        mine = {w.id for w in self.ids}
        return sum(w["pushes"] for w in self.srv.get_json("/v1/workers") if w["id"] not in mine)

    def register_flood(self) -> None:
        """256 registrations as fast as one client goes, beside the flips (which take each id as it is admitted)."""
        try:
            wait_for(lambda: len(_honest_ids(self.srv)) == len(HONEST) or self.stop.is_set(), HANG_S,
                     "the honest agents to join", interval=0.5)
            for i in range(self.flood):
                if self.stop.is_set():
                    return
                r = _register(self.srv, f"sybil-{i}")
                if r.status_code == 410:  # the run reached its target and stopped while the flood went on
                    return
                self.codes.append(r.status_code)
                if r.status_code == 200:
                    body = r.json()
                    self.ids.append(WorkerHandle(server=self.srv, id=body["worker_id"], token=body["token"],
                                                 name=f"sybil-{i}", model_spec=body["model_spec"],
                                                 run_config=body["run_config"]))
                else:
                    self.retry_after.append(r.headers.get("Retry-After", ""))
        except BaseException as exc:  # reported by the run
            self.error = exc

    def push(self, attack: str, delta: torch.Tensor) -> str:
        if attack.startswith("flip"):  # each flip under the next id
            self.w = self.ids[self.turn % len(self.ids)]
            self.turn += 1
        return super().push(attack, delta)

    def run(self, *, first_push_done: threading.Event) -> None:  # type: ignore[override]
        if self.flood:
            self.flooder = threading.Thread(target=self.register_flood, daemon=True)
            self.flooder.start()
        super().run(first_push_done=first_push_done)
        if self.flood:
            self.flooder.join(timeout=HANG_S)


def sybils_run(tmp_path: Path, preset: str = "asp", attack: bool = True) -> dict[str, Any]:
    from tests.integration.test_signflip_live import attacked_throughout_reach

    # --register-rate 0: as from many source addresses (the per-address limit would stop them first).
    with running_server(tmp_path / "server", "--preset", preset, "--register-rate", "0") as srv:
        attacker = SybilFlipper(srv, 10.0 if attack else 0.0, 256 if attack else 0)
        # The flood runs beside the flips; ``admitted`` and the codes are read once it is over (the attacker's
        # thread joins it before it ends). It starts the honest agents itself and times them from their start, as the sign-flip runs.
        status, seconds, pushed = attacked_throughout_reach(srv, attacker, HONEST, tmp_path,
                                                            f"{preset} to reach {TARGET} past Sybils")
        r = srv.http.get(srv.url + "/v1/status", headers={"Authorization": f"Bearer {JOIN_TOKEN}"})
        screening = r.json()["screening"]
        honest = set(_honest_ids(srv).values())
        assert len(honest) == len(HONEST)
        assert not {e["worker"] for e in _events(srv, "update_screened_out")} & honest, screening
        assert not set(screening["quarantined"]) & honest, screening
        admitted = len(attacker.ids) - 1
        if attack:
            # The flood stops with the run: past the cap (64 names per join token) every answer was a 429 with
            # Retry-After (test_trust_live checks the cap itself).
            assert attacker.codes and set(attacker.codes) <= {200, 429}, attacker.codes
            assert admitted <= 64 - 1 - len(HONEST) - 1, admitted  # the fixture's probe, the agents, the attacker
            assert all(v.isdigit() for v in attacker.retry_after), attacker.retry_after
        flips = [r for r in attacker.replies[:pushed] if r[0].startswith("flip")]
        result = {"suite": "sybils", "preset": preset, "attack": attack, "seconds_to_target": round(seconds, 1),
                  "accuracy": status["evaluation"]["accuracy"], "refusals": screening["refusals"],
                  "sybils_admitted": admitted, "sybils_refused": len(attacker.codes) - admitted,
                  "flips_before_target": len(flips), "flips_applied_before_target":
                      sum(r[1] == "applied" for r in flips), "clipped": screening["clipped"],
                  "quarantined": len(screening["quarantined"])}
        (tmp_path / "sybils.json").write_text(json.dumps(result))
        print(json.dumps(result))
        return result


# ---------------------------------------------------------------------------------------------------------------
# a bit flipped mid-journal


def journal_run(tmp_path: Path, preset: str = "asp", attack: bool = True) -> dict[str, Any]:
    ckpt = tmp_path / "ckpt"
    state = tmp_path / "state"
    agents: list[subprocess.Popen] = []
    try:
        with running_server(tmp_path / "first", "--preset", preset, "--checkpoint-dir", str(ckpt),
                            "--checkpoint-interval", "3600", check_exit=False) as first:
            t0 = time.monotonic()
            agents = [_agent(first.url, n, tmp_path / f"{n}.log", state) for n in HONEST]
            wait_for(lambda: first.healthz()["model_version"] >= KILL_AT, HANG_S, f"version {KILL_AT}")
            refused_before = {e["worker"] for e in _events(first, "update_screened_out")}
            ports = (first.port, first.data_port)
            first.proc.kill()  # no shutdown hook: the journal is all there is
            first.proc.wait(timeout=60)
        lost = 0
        extra: tuple[str, ...] = ()
        if attack:
            journal = ckpt / "journal-0.log"
            data = bytearray(journal.read_bytes())
            data[len(data) // 2] ^= 0x10
            journal.write_bytes(bytes(data))
            refused = subprocess.run([sys.executable, "-m", "hermes.server.cli", "--resume", str(ckpt), "--port",
                                      "0", "--data-port", "0", "--out", str(tmp_path / "refused-out")],
                                     capture_output=True, text=True, timeout=HANG_S, env=_server_env())
            assert refused.returncode == 2, refused.stderr[-2000:]
            lines = refused.stderr.strip().splitlines()
            assert len(lines) == 1 and "--resume-truncate-corrupt" in lines[0], refused.stderr
            lost = int(lines[0].split("would lose ")[1].split(" ")[0])
            extra = ("--resume-truncate-corrupt",)
        with running_server(tmp_path / "second", "--preset", preset, "--resume", str(ckpt), *extra,
                            ports=ports) as second:
            resumed = second.get_json("/v1/status")["resumed_from"]
            assert resumed.get("dropped_updates", 0) == lost, resumed
            status, at = _reached_after(second, lambda: resumed["version"],
                                        f"{preset} to reach {TARGET} after the resume")
            screening = _stop_and_check(second, agents, tmp_path, attackers=set())
            assert not refused_before, refused_before  # nobody but honest agents in this run
    finally:
        kill_agents(agents)
    return _result("journal", preset, attack, t0, at, status, screening, tmp_path,
                   resumed_version=resumed["version"], dropped_updates=lost)


RUNS: dict[str, Callable[..., dict[str, Any]]] = {
    "takeover": takeover_run, "barrier": barrier_run, "sybils": sybils_run, "journal": journal_run}


@pytest.mark.slow
@pytest.mark.parametrize("suite", sorted(RUNS))
def test_attacked_run_reaches_the_target_with_no_honest_worker_refused(tmp_path, suite):
    RUNS[suite](tmp_path, attack=True)
