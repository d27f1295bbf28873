"""Lying samples and lying speed against bsp and edp-sgd, live (issue 29's "Must show").

Real ``hermes-server`` (default screening and claim bounds), three honest ``hermes-client``
agents and a fourth worker through the real data plane that pushes a zero update every round.
Lying, it claims what issue 29 found owned the run: ``samples: 1e9`` in every push (``bsp``:
weight 1.0 in every round, 0.975 -> 0.061) or a cycle of "128 samples in 1e-6 s" (``edp-sgd``:
power weight 0.99995, 0.978 -> 0.183). Truthful (the honest run of the 1.5x comparison,
``benchmarks/attack_matrix.py --suite claims``), it claims one sample, or 128 samples in one second.

The run must reach the target and no honest worker may be refused or quarantined. The liar's weight
in a round must be at most an honest worker's under bsp (samples clamped to the assigned work). Under
edp-sgd a claimer that never asks for work is capped at the others' median speed (at most half a round
beside three; it took 0.945 under the 8x bound alone, 2026-11-27; issue 29 measured 0.99995 before any
bound). One that asks for work and names it in its reports (``work=True``) is held by the elapsed-time
floor: its seconds at least 0.25 of the wall time since the hand-out. The 1.5x rule for this case is
measured by benchmarks/attack_matrix.py --suite claims.
"""

from __future__ import annotations

import json
import threading
import time
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


# A paced claimer (``work=True``) asks for work like an agent, holds each assignment as long as a device of
# this speed would take to train it (honest digits agents here train 100-500 samples/s), and names it in its
# cycle report. A fixed pace would make it faster the more work it is given: it trains nothing.
REAL_SPEED = 256.0


def _claims(preset: str, lie: bool, work: dict[str, Any] | None = None) -> dict[str, Any]:
    if preset == "edp-sgd":  # the compute power the partition allocator and the power rule read
        if work is not None:  # the assignment it was handed, named (CycleReport.assignment)
            cycle = {"dss": work["cycle_samples"], "batch_size": work["batch_size"],
                     "compute_seconds": 1e-6 if lie else work["cycle_samples"] / REAL_SPEED,
                     "assignment": work["assignment"]}
            return {"samples": work["cycle_samples"], "cycle": cycle}
        cycle = {"dss": 128, "batch_size": 32, "compute_seconds": 1e-6 if lie else 1.0}
        return {"samples": 128, "cycle": cycle}
    return {"samples": 1_000_000_000 if lie else 1}


def _lying_run(tmp_path: Path, preset: str, lie: bool, honest: int = 3, work: bool = False) -> dict[str, Any]:
    names = [f"honest-{i}" for i in range(honest)]
    with running_server(tmp_path / "server", "--preset", preset, sets=("eval_interval_seconds=0.5",)) as srv:
        claimer = srv.register("claimer")
        stop = threading.Event()
        errors: list[BaseException] = []
        replies: list[str] = []

        def push_every_round() -> None:
            try:
                while not stop.is_set():
                    handed = None
                    if work:
                        reply = srv.exchange(claimer.frames(MsgType.REQUEST_WORK, body={}), timeout=120)
                        assert reply.header.type is MsgType.WORK, reply.header
                        handed = reply.header.body
                        time.sleep(handed["cycle_samples"] / REAL_SPEED)  # what training it would take
                    version = srv.healthz()["model_version"]
                    msg = srv.exchange(claimer.frames(MsgType.PUSH_UPDATE, torch.zeros(claimer.numel),
                                                      model_version=version, shapes=claimer.shapes,
                                                      body=_claims(preset, lie, handed)), timeout=120)
                    replies.append(msg.header.body.get("status", msg.header.type.value))
                    if msg.header.body.get("stop"):
                        return
                    # A barrier held the reply to the round's end; the next round needs the new model.
                    wait_for(lambda v=version: srv.healthz()["model_version"] > v or stop.is_set(), HANG_S,
                             "the next round")
            except BaseException as exc:  # reported by the test
                errors.append(exc)

        thread = threading.Thread(target=push_every_round, daemon=True)
        thread.start()
        t0 = time.monotonic()
        agents = [start_agent(srv.url, n, tmp_path / f"{n}.log", "--threads", "1") for n in names]
        try:
            def reached() -> dict[str, Any] | None:
                s = srv.get_json("/v1/status")
                ev = s["evaluation"]
                return s if ev and ev["accuracy"] >= TARGET else None

            status = wait_for(reached, HANG_S, f"{preset} to reach {TARGET} beside a worker claiming {_claims(preset, lie)}")
            seconds = time.monotonic() - t0
            r = srv.http.post(srv.url + "/v1/stop", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
            assert r.status_code == 200, r.text
            codes = [a.wait(timeout=60) for a in agents]
        finally:
            stop.set()
            kill_agents(agents)
        thread.join(timeout=60)
        logs = [(tmp_path / f"{n}.log").read_text(errors="replace") for n in names]
        assert codes == [0] * honest, [log[-2000:] for log in logs]
        assert not errors, errors
        assert "applied" in replies, replies
        r = srv.http.get(srv.url + "/v1/status", headers={"Authorization": f"Bearer {JOIN_TOKEN}"})
        assert r.status_code == 200, r.text
        screening = r.json()["screening"]
        refused = {e["worker"] for e in _events(srv, "update_screened_out")}
        assert refused <= {claimer.id}, (refused, screening)
        assert set(screening["quarantined"]) <= {claimer.id}, screening
        # The claimer's weight in the rounds it was folded in beside honest workers whose speed the server had
        # seen (a worker's first round has no measured power yet: the rule gives it next to nothing).
        events = [json.loads(line) for line in (srv.out_dir / "events.jsonl").read_text().splitlines()]
        # The most a claim counts (a full cycle: what an honest worker counts at most), and each honest worker's
        # samples in its latest cycle report (logged before the fold that counts it).
        bound = max((e["bound"] for e in events if e["event"] == "claim_clamped" and e["worker"] == claimer.id
                     and e["field"] == "samples"), default=None)
        dss: dict[str, int] = {}
        seen: dict[str, int] = {}
        worst = 0.0
        judged = 0
        judged_weights: list[float] = []
        for e in events:
            if e["event"] == "cycle":
                dss[e["worker"]] = e["dss"]
            if e["event"] != "update_applied":
                continue
            weights = dict(zip(e["workers"], e["weights"]))
            others = [w for w in weights if w != claimer.id]
            if claimer.id in weights and others and all(seen.get(w, 0) >= 2 for w in others):
                judged += 1
                mine, best_honest = weights[claimer.id], max(weights[w] for w in others)
                judged_weights.append(mine)
                if preset == "edp-sgd":
                    # Claims bound a speed to power_factor (8) x the median of the others' (HL8 fleets differ by 8x,
                    # server/engine/claims.py): a liar's power share is about 8 / (8 + n_honest), 0.73 beside three,
                    # a little more as the others' speeds move between the clamp and the fold (0.740 seen).
                    # One that names its assignment is held by the elapsed-time floor too (checked below). One
                    # that never asked for work is capped at the others' median speed (the clamp's tolerance, 2x,
                    # lets a claim under 2x the median through): at most half of a round beside three.
                    assert mine <= (8 / (8 + len(others)) if work else 0.5) + 0.1, e
                else:
                    # Weights follow the counted samples: the claimer counts at most ``bound``, a full cycle. Beside
                    # an honest short cycle (an epoch's last: 77 of 128) that outweighs the honest worker as a
                    # truthful full cycle would (0.624 against 0.376 in a matrix run), never more.
                    best = max(others, key=weights.__getitem__)
                    allowed = best_honest * max(1.0, bound / dss[best]) if bound and dss.get(best) else best_honest
                    assert mine <= allowed + 1e-9, (e, bound, dss.get(best))
                worst = max(worst, mine)
            for w in weights:
                seen[w] = seen.get(w, 0) + 1
        assert judged, "the claimer was never folded beside honest workers"
        if lie:
            assert sum(screening["claims_clamped"].values()) >= 1, screening
        floor = screening["claims_windows"]["floor"]
        if work:
            # Each cycle it named was held dss / REAL_SPEED after its hand-out: a window of at least that, so
            # its seconds were raised to at least floor x that (4x its real speed at most, with the default 0.25).
            cycles = {e["ts"]: e for e in _events(srv, "cycle") if e["worker"] == claimer.id}
            raised = [e for e in _events(srv, "claim_clamped")
                      if e["worker"] == claimer.id and e["field"] == "compute_seconds"]
            if lie:
                assert raised, screening
                assert all(c["dss"] / c["compute_seconds"] <= REAL_SPEED / floor * 1.01 for c in cycles.values()
                           if c["compute_seconds"] > 1e-6), sorted(c["dss"] / c["compute_seconds"] for c in cycles.values())
            assert screening["claims_windows"]["closed"] >= 1, screening
        shares = sorted(judged_weights)
        result = {"suite": "claims", "preset": preset, "lie": lie, "work": work, "seconds_to_target": round(seconds, 1),
                  "claims_clamped": screening["claims_clamped"], "claimer_max_weight": round(worst, 4),
                  "claimer_median_weight": round(shares[len(shares) // 2], 4) if shares else None,
                  "claims_windows": screening["claims_windows"], "accuracy": status["evaluation"]["accuracy"]}
        (tmp_path / "claims.json").write_text(json.dumps(result))
        print(json.dumps(result))
        return result


@pytest.mark.parametrize(("preset", "lie"), [("bsp", True), ("edp-sgd", True)])
def test_a_lying_claim_does_not_own_the_round(tmp_path, preset, lie):
    _lying_run(tmp_path, preset, lie)


@pytest.mark.parametrize("lie", [True, False])
def test_a_speed_liar_that_names_its_assignment_is_held_by_the_elapsed_time_floor(tmp_path, lie):
    # issue 29: "speeds by the elapsed time between assignment and push". The claimer asks for work and holds
    # each assignment as a REAL_SPEED device would; lying, it claims 1e-6 s; truthful, that time (the
    # comparison: what its real speed earns).
    _lying_run(tmp_path, "edp-sgd", lie, work=True)
