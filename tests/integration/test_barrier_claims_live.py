"""bsp against workers that hold its barrier or lie about their work, live (issue 29).

Real ``hermes-server`` (bsp, default screening), two honest ``hermes-client``
agents and, through the real data plane:

* a **silent** worker: registers and heartbeats, never pushes (it held bsp at
  version 0 for the whole run);
* a **failing** worker: every push draws an error reply (wrong shapes), so none
  reaches the barrier;
* a **liar**: pushes a zero update every round claiming ``samples: 1e9`` (it took
  weight 1.0 in every round, 0.975 -> 0.061).

The run must reach the target: rounds go on without the silent and failing workers
after the deadline, the liar's claim is clamped to the assigned work. At the end the
silent worker pushes a valid update: it is folded (it rejoins the round).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from hermes.common.wire import MsgType
from tests.conftest import ADMIN_TOKEN, JOIN_TOKEN, kill_agents, running_server, start_agent, wait_for
from tests.integration.test_attack_live import _events

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TARGET = 0.8
HANG_S = 300.0


def _heartbeats(srv: Any, handles: list[Any], stop: threading.Event) -> None:
    while not stop.wait(1.0):
        for w in handles:
            srv.http.post(f"{srv.url}/v1/workers/{w.id}/heartbeat", headers={"X-Hermes-Token": w.token})


def test_silent_failing_and_lying_workers_do_not_hold_or_own_bsp(tmp_path: Path) -> None:
    names = ["honest-0", "honest-1"]
    with running_server(tmp_path / "server", "--preset", "bsp", "--heartbeat-timeout", "30",
                        sets=("eval_interval_seconds=0.5", "bsp.min_wait_seconds=3")) as srv:
        silent, failing, liar = srv.register("silent"), srv.register("failing"), srv.register("liar")
        stop = threading.Event()
        errors: list[BaseException] = []
        liar_replies: list[str] = []
        failing_replies: list[str] = []

        def lie() -> None:
            try:
                while not stop.is_set():
                    version = srv.healthz()["model_version"]
                    msg = srv.exchange(liar.frames(MsgType.PUSH_UPDATE, torch.zeros(liar.numel), model_version=version,
                                                   shapes=liar.shapes, body={"samples": 1_000_000_000}), timeout=120)
                    liar_replies.append(msg.header.body.get("status", "?"))
                    if msg.header.body.get("stop"):
                        return
            except BaseException as exc:  # reported by the test
                errors.append(exc)

        def fail() -> None:
            try:
                while not stop.wait(0.5):
                    msg = srv.exchange(failing.frames(MsgType.PUSH_UPDATE, torch.zeros(failing.numel + 1),
                                                      model_version=0, shapes=((failing.numel + 1,),),
                                                      body={"samples": 1}))
                    failing_replies.append(msg.header.type.value)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=_heartbeats, args=(srv, [silent, failing], stop), daemon=True),
                   threading.Thread(target=lie, daemon=True), threading.Thread(target=fail, daemon=True)]
        for t in threads:
            t.start()
        agents = [start_agent(srv.url, n, tmp_path / f"{n}.log", "--threads", "1") for n in names]
        try:
            def reached() -> dict[str, Any] | None:
                s = srv.get_json("/v1/status")
                ev = s["evaluation"]
                return s if ev and ev["accuracy"] >= TARGET else None

            wait_for(reached, HANG_S, "bsp to reach the target past silent, failing and lying workers")
            # The silent worker comes back with a valid update: folded in a round again.
            version = srv.healthz()["model_version"]
            msg = srv.exchange(silent.frames(MsgType.PUSH_UPDATE, torch.zeros(silent.numel), model_version=version,
                                             shapes=silent.shapes, body={"samples": 1}), timeout=120)
            rejoined = msg.header.body.get("status")
            r = srv.http.post(srv.url + "/v1/stop", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
            assert r.status_code == 200, r.text
            codes = [a.wait(timeout=60) for a in agents]
        finally:
            stop.set()
            kill_agents(agents)
        logs = [(tmp_path / f"{n}.log").read_text(errors="replace") for n in names]
        assert codes == [0, 0], [log[-2000:] for log in logs]
        assert not errors, errors
        assert rejoined == "applied", msg.header.body
        assert failing_replies and set(failing_replies) == {"error"}, failing_replies
        assert "applied" in liar_replies, liar_replies
        # The screening's counts beyond refusals are for cluster members: read with the join token.
        r = srv.http.get(srv.url + "/v1/status", headers={"Authorization": f"Bearer {JOIN_TOKEN}"})
        assert r.status_code == 200, r.text
        screening = r.json()["screening"]
        assert screening["claims_clamped"].get("samples", 0) >= 1, screening
        # The liar's weight in its rounds: at most an honest worker's (clamped to the assigned work).
        applied = [e for e in _events(srv, "update_applied") if liar.id in e["workers"]]
        assert applied
        for e in applied:
            weights = dict(zip(e["workers"], e["weights"]))
            assert weights[liar.id] <= max(w for k, w in weights.items() if k != liar.id) + 1e-9, e
        assert "Traceback" not in srv.log_text()
