"""Poisoned and broken updates against a live server (issue 15): update
screening on asp, bsp and hermes, quarantine, the non-finite model guard, and
the admin token that ``--insecure`` no longer waives."""

from __future__ import annotations

import json
import threading

import httpx
import pytest
import torch

from hermes.common.wire import MsgType
from tests.conftest import ADMIN_TOKEN, JOIN_TOKEN, wait_for

pytestmark = pytest.mark.integration

# An honest-sized update of the digits CNN (22k parameters, ||w0|| = 6.4):
# norm ~0.45, the size of one cycle's step at the presets' learning rates.
_HONEST = 0.003


def _honest(worker, seed: int, scale: float = 1.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return scale * _HONEST * torch.randn(worker.numel, generator=gen)


def _push(worker, delta: torch.Tensor) -> dict:
    """Push from the worker's current model (hermes: from w0, base 0 is always valid); the reply body."""
    version = 0 if worker.run_config["sync"] == "hermes" else worker.pull()[0]
    msg = worker.push(delta, base_version=version, samples=64)
    assert msg.header.type is MsgType.PUSH_REPLY, msg.header
    return msg.header.body


def _events(server, kind: str) -> list[dict]:
    lines = (server.out_dir / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e.get("event") == kind]


def _round(honest, attacker, delta: torch.Tensor, seed: int) -> dict:
    """The honest worker pushes an honest update, the attacker ``delta``; the attacker's reply body.

    Concurrently: under bsp the barrier holds the first reply until both pushed.
    """
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(_push(honest, _honest(honest, seed))))
    t.start()
    body = _push(attacker, delta)
    t.join(timeout=60)
    assert out.get("status") == "applied", out
    return body


@pytest.mark.parametrize("preset", ["asp", "bsp", "hermes"])
def test_poisoned_pushes_are_refused_and_the_attacker_quarantined(server_factory, preset):
    # Refusals count as evidence once per model version and at least min_gap_seconds apart
    # (issue 29); 0 here: each round is a new version, and the rounds come faster than 1 s.
    srv = server_factory("--preset", preset, env={"HERMES_SCREENING__QUARANTINE__MIN_GAP_SECONDS": "0"})
    honest, attacker = srv.register(f"{preset}-honest"), srv.register(f"{preset}-attacker")
    # The first push of the run is not trusted: bounded by the model's own scale.
    first = _round(honest, attacker, _honest(attacker, 1, scale=1000.0), seed=100)
    assert first["status"] == "rejected" and "first updates of the run" in first["reason"], first
    for i in range(5):  # the attacker behaves at first: history for the median
        assert _round(honest, attacker, _honest(attacker, 200 + i), seed=101 + i)["status"] == "applied"
    version = srv.healthz()["model_version"]

    def refused(delta: torch.Tensor, seed: int) -> str:
        body = _round(honest, attacker, delta, seed)
        assert body["status"] == "rejected", body
        return body["reason"]

    huge = refused(_honest(attacker, 7, scale=1000.0), 300)
    assert huge.startswith("rejected: norm") and "× median" in huge, huge
    one = _honest(attacker, 8)
    one[123] = 3e38
    reason = refused(one, 301)  # hermes scores the candidate first: its loss is NaN
    assert "overflows" in reason or "candidate loss nan" in reason, reason
    spike = _honest(attacker, 9)
    spike[5] = 1e4
    assert "× median" in refused(spike, 302)
    # A stream of slightly scaled updates: folded while within the bound, refused past it.
    outcomes = [_round(honest, attacker, _honest(attacker, 20 + i, scale=1.6 ** i), 400 + i)["status"]
                for i in range(1, 16)]
    assert outcomes[0] == "applied" and "rejected" in outcomes[4:], outcomes
    screening = srv.get_json("/v1/status")["screening"]
    assert attacker.id in screening["quarantined"], screening
    assert srv.workers()[attacker.id]["quarantined"] is True
    assert srv.workers()[honest.id]["quarantined"] is False
    assert srv.counter("hermes_quarantined_workers") == 1
    assert srv.counter("hermes_screening_refusals_total", reason="norm") >= 3
    assert srv.counter("hermes_screening_refusals_total", reason="bootstrap_norm") == 1
    assert _events(srv, "worker_quarantined")[0]["worker"] == attacker.id
    # Quarantined: even an honest-sized push is screened but not folded (probation); the honest
    # worker goes on (under bsp the refused push still releases the barrier).
    body = _round(honest, attacker, _honest(attacker, 50), 500)
    assert body["status"] == "rejected" and "quarantined" in body["reason"], body
    assert srv.counter("hermes_screening_refusals_total", reason="quarantined") >= 1
    assert srv.healthz()["model_version"] > version
    _, model = honest.pull()
    assert bool(torch.isfinite(model).all()) and float(model.norm()) < 50.0
    assert "update from" in srv.log_text() and "Traceback" not in srv.log_text()


def test_honest_pushes_are_never_refused(server_factory):
    srv = server_factory("--preset", "asp")
    workers = [srv.register(f"h{i}") for i in range(3)]
    for i in range(30):
        w = workers[i % 3]
        # Heterogeneous workloads: update sizes differing by 4x are honest.
        body = _push(w, _honest(w, 300 + i, scale=(1.0, 2.0, 4.0)[i % 3]))
        assert body["status"] == "applied", body
    assert srv.get_json("/v1/status")["screening"]["refusals"] == {}


def test_hermes_nan_candidate_loss_is_refused_not_a_traceback(server_factory):
    srv = server_factory("--preset", "hermes")
    w = srv.register("nan-loss")
    # Finite weights whose activations overflow: the probe's loss is NaN.
    body = _push(w, torch.full((w.numel,), 1e18))
    assert body["status"] == "rejected" and "not finite" in body["reason"], body
    assert srv.healthz()["model_version"] == 0
    assert srv.counter("hermes_screening_refusals_total", reason="loss") == 1
    assert _push(w, _honest(w, 1))["status"] == "applied"
    assert "Traceback" not in srv.log_text()


def test_non_finite_model_is_rolled_back(server_factory):
    srv = server_factory("--preset", "asp", screening_off_because="the non-finite guard behind screening must "
                         "hold on its own")
    w = srv.register("overflow")
    good_version, good = w.pull()
    delta = torch.zeros(w.numel)
    delta[0] = 3e38
    assert _push(w, delta)["status"] == "applied"
    assert _push(w, delta)["status"] == "applied"  # 6e38 overflows float32: Inf
    wait_for(lambda: _events(srv, "model_restored"), 10, "a model_restored event")
    restored = _events(srv, "model_restored")[0]
    assert restored["bad_version"] == 2 and restored["restored"] in (0, 1)
    version, model = w.pull()
    assert version == 2 and bool(torch.isfinite(model).all())
    assert srv.counter("hermes_model_restores_total") == 1
    assert "was not finite; restored the model" in srv.log_text()


def test_stop_needs_the_admin_token_even_when_insecure(server_factory):
    srv = server_factory("--insecure", env={"HERMES_JOIN_TOKEN": None, "HERMES_ADMIN_TOKEN": None})
    for headers in ({}, {"Authorization": "Bearer " + ADMIN_TOKEN}):
        r = srv.http.post(srv.url + "/v1/stop", headers=headers)
        assert r.status_code == 401, r.text
    assert srv.healthz()["stopping"] is False
    token = (srv.out_dir / "admin.token").read_text().strip()
    r = httpx.post(srv.url + "/v1/stop", headers={"Authorization": f"Bearer {token}"}, timeout=10)
    assert r.status_code == 200 and r.json()["stopping"] is True


def test_non_finite_and_oversized_registrations_are_refused(live_server):
    headers = {"Authorization": "Bearer " + JOIN_TOKEN, "Content-Type": "application/json"}
    r = live_server.http.post(live_server.url + "/v1/workers/register", headers=headers,
                              content=b'{"name": "x", "slowdown": 1e309}')
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "slowdown", r.text
    r = live_server.http.post(live_server.url + "/v1/workers/register", headers=headers,
                              json={"name": "big", "hints": {"blob": "x" * 100_000}})
    # Refused from its Content-Length before anything parses it (server/limits.py).
    assert r.status_code == 413 and "limit" in r.text, r.text[:300]
    live_server.register_raw("hinted", hints={"memory_available_bytes": 1 << 30, "secret_note": "y" * 100})
    joins = _events(live_server, "join")
    assert "y" * 100 not in json.dumps(joins) and "big" not in {e["name"] for e in joins}
    assert "Traceback" not in live_server.log_text()


def test_fedasync_push_back_to_w0_is_refused(server_factory):
    # FedAsync mixes x_new = w0 + G into the model with weight alpha and has no loss probe: a
    # worker pushing G = 0 pulls the model back towards w0. Screened by the step the blend takes,
    # ||w0 + G - w||, not by ||G|| (which is 0 there).
    srv = server_factory("--preset", "fedasync")
    w = srv.register("fedasync-honest")
    _, w0 = w.pull()
    step = torch.full((w.numel,), 0.1 / w.numel ** 0.5)  # norm 0.1, always the same direction
    for _ in range(80):
        version, current = w.pull()
        msg = w.push((current - w0) + step, base_version=version, samples=64)
        assert msg.header.body["status"] == "applied", msg.header.body
    _, current = w.pull()
    assert float((current - w0).norm()) > 32 * 0.1  # the model has moved away from w0
    version, _ = w.pull()
    body = w.push(torch.zeros(w.numel), base_version=version, samples=64).header.body
    assert body["status"] == "rejected" and "× median" in body["reason"], body
    _, after = w.pull()
    assert torch.equal(after, current)
