"""Identity, Sybils, quarantine, the journal and agents that recover, against a live server (issue 29).

Real ``hermes-server`` processes and real ``hermes-client`` agents (their name
keys in a temporary state directory); attackers speak the protocol with the
tests' raw helpers, as someone holding only the join token would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch

from hermes.common.wire import MsgType
from tests.conftest import (
    ADMIN_TOKEN,
    JOIN_TOKEN,
    _server_env,
    kill_agents,
    running_server,
    wait_for,
)

pytestmark = pytest.mark.integration

HANG_S = 120  # only catches a hang
_HONEST = 0.003  # an honest-sized update element (test_screening_live)


def _agent(url: str, name: str, log: Path, state: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "HERMES_JOIN_TOKEN": JOIN_TOKEN, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
           "HERMES_AGENT_STATE": str(state)}
    with open(log, "wb") as fh:
        return subprocess.Popen([sys.executable, "-m", "hermes.client.cli", "--server", url, "--name", name,
                                 "--no-progress", "--threads", "1", *extra],
                                stdout=fh, stderr=subprocess.STDOUT, env=env)


def _events(srv, kind: str) -> list[dict]:
    lines = (srv.out_dir / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e.get("event") == kind]


def _register(srv, name: str, token: str = JOIN_TOKEN, **fields) -> httpx.Response:
    return srv.http.post(srv.url + "/v1/workers/register", json={"name": name, **fields},
                         headers={"Authorization": f"Bearer {token}"})


def _stop(srv) -> None:
    r = srv.http.post(srv.url + "/v1/stop", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert r.status_code == 200, r.text


def test_name_takeover_is_refused_and_the_honest_agent_keeps_its_id_and_its_pushes(tmp_path):
    with running_server(tmp_path / "srv") as srv:
        state = tmp_path / "state"
        agent = _agent(srv.url, "edge-a", tmp_path / "a.log", state)
        try:
            wid = wait_for(lambda: next((w["id"] for w in srv.get_json("/v1/workers")
                                         if w["name"] == "edge-a" and w["applied"] >= 2), None), HANG_S,
                           "the honest agent's first applied pushes")
            # The attack: the honest name, no instance hint, no key; then with a key of its own.
            for fields in ({}, {"name_key": "x" * 43}, {"name_key": "x" * 43, "hints": {"instance": "ab" * 8}}):
                r = _register(srv, "edge-a", **fields)
                assert r.status_code == 409 and "belongs to the agent that registered it first" in r.json()["detail"]
                assert "token" not in r.json()
            applied = srv.workers()[wid]["applied"]
            wait_for(lambda: srv.workers()[wid]["applied"] >= applied + 3, HANG_S, "more honest pushes applied")
            assert srv.workers()[wid]["rejected"] == 0
            assert srv.counter("hermes_registrations_total", outcome="name_owned") == 3
            # The honest agent restarted (SIGTERM: it says goodbye) re-proves its name from its state directory.
            agent.send_signal(signal.SIGTERM)
            assert agent.wait(timeout=HANG_S) == 0
            agent = _agent(srv.url, "edge-a", tmp_path / "a2.log", state)
            wait_for(lambda: any(e["name"] == "edge-a" and e["rejoined"] for e in _events(srv, "join")), HANG_S,
                     "the restarted agent's registration")
            applied = srv.workers()[wid]["applied"]
            wait_for(lambda: srv.workers()[wid]["applied"] > applied, HANG_S, "the restarted agent's pushes")
            assert [w["id"] for w in srv.get_json("/v1/workers") if w["name"] == "edge-a"] == [wid]
            _stop(srv)
            assert agent.wait(timeout=HANG_S) == 0
        finally:
            kill_agents([agent])
        assert "Traceback" not in srv.log_text()


def test_sybils_are_capped_per_join_token_and_every_refusal_says_when_to_retry(tmp_path):
    tokens = tmp_path / "join.tokens"
    site_b = "site-b-token-" + "5" * 32
    tokens.write_text(f"{JOIN_TOKEN}\n{site_b}\n")
    env = {"HERMES_JOIN_TOKEN": None, "HERMES_JOIN_TOKEN_MAX_WORKERS": "16"}
    # --register-rate 0: as from many source addresses (the per-address limit would stop them first).
    with running_server(tmp_path / "srv", "--join-token-file", str(tokens), "--register-rate", "0",
                        env=env) as srv:
        state = tmp_path / "state"
        early = _agent(srv.url, "honest-early", tmp_path / "early.log", state)
        try:
            wait_for(lambda: any(w["name"] == "honest-early" for w in srv.get_json("/v1/workers")), HANG_S,
                     "the early honest agent")
            codes = [_register(srv, f"sybil-{i}") for i in range(256)]
            ok = [r for r in codes if r.status_code == 200]
            refused = [r for r in codes if r.status_code != 200]
            # 16 names for the token: the fixture's probe, the early honest agent, 14 Sybils.
            assert len(ok) == 14
            assert {r.status_code for r in refused} == {429}
            assert all(r.headers.get("Retry-After", "").isdigit() for r in refused)
            assert "join_token_max_workers" in refused[0].json()["detail"]
            # An honest agent of another site, with its own token, still joins.
            late = subprocess.Popen(
                [sys.executable, "-m", "hermes.client.cli", "--server", srv.url, "--name", "honest-late",
                 "--no-progress", "--threads", "1"], stdout=open(tmp_path / "late.log", "wb"),
                stderr=subprocess.STDOUT,
                env={**os.environ, "HERMES_JOIN_TOKEN": site_b, "OMP_NUM_THREADS": "1",
                     "HERMES_AGENT_STATE": str(state)})
            try:
                wait_for(lambda: any(w["name"] == "honest-late" and w["applied"] >= 1
                                     for w in srv.get_json("/v1/workers")), HANG_S, "the late honest agent's push")
                # The early one rejoining is no new name: not capped.
                r = srv.http.post(srv.url + "/v1/workers/register", json={"name": "sybil-0"},
                                  headers={"Authorization": f"Bearer {JOIN_TOKEN}"})
                assert r.status_code == 200 and r.json()["rejoined"]
                _stop(srv)
                assert late.wait(timeout=HANG_S) == 0 and early.wait(timeout=HANG_S) == 0
            finally:
                kill_agents([late])
        finally:
            kill_agents([early])
        assert srv.counter("hermes_limit_hits_total", limit="join_token_max_workers") == len(refused)


def test_every_429_and_503_of_registration_carries_retry_after(tmp_path):
    # The fixture's probe registration takes one place and one token of the burst.
    with running_server(tmp_path / "srv", "--register-rate", "1", "--register-burst", "3",
                        "--max-workers", "2") as srv:
        answers = [_register(srv, f"n{i}") for i in range(4)]
        assert [r.status_code for r in answers[:2]] == [200, 503], [r.text for r in answers]  # max_workers
        assert answers[2].status_code == 429
        for r in answers[1:]:
            assert r.headers.get("Retry-After", "").isdigit(), (r.status_code, r.headers)
        r = _register(srv, "w0001")
        assert r.status_code == 422 and "looks like a worker id" in json.dumps(r.json())
        r = _register(srv, "edge", protocol_version=False)
        assert r.status_code == 422 and "protocol_version" in json.dumps(r.json())
        # The schema says what the routes answer: /metrics is text, an undecodable body a 400.
        paths = srv.get_json("/openapi.json")["paths"]
        assert set(paths["/metrics"]["get"]["responses"]["200"]["content"]) == {"text/plain"}
        assert "400" in paths["/v1/workers/register"]["post"]["responses"]
        assert "/v1/workers/{worker_id}/release" in paths
        r = srv.http.post(srv.url + "/v1/workers/register", content=b"{not json",
                          headers={"Authorization": f"Bearer {JOIN_TOKEN}", "Content-Type": "application/json"})
        assert r.status_code in (400, 422), r.text


def _push_journaled(w, n: int, seed: int = 0) -> int:
    gen = torch.Generator().manual_seed(seed)
    v, _ = w.pull()
    for _ in range(n):
        reply = w.push(_HONEST * torch.randn(w.numel, generator=gen), base_version=v)
        assert reply.header.body["status"] == "applied", reply.header.body
        v = reply.header.model_version
    return v


def _resume(ckpt: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hermes.server.cli", "--resume", str(ckpt), "--port", "0",
                           "--data-port", "0", "--out", str(ckpt.parent / "resumed-out"), *extra],
                          capture_output=True, text=True, timeout=HANG_S, env=_server_env())


def test_a_bit_flipped_mid_journal_refuses_the_resume_with_the_count_unless_told(tmp_path):
    ckpt = tmp_path / "ckpt"
    with running_server(tmp_path / "first", "--checkpoint-dir", str(ckpt), "--checkpoint-interval", "3600",
                        check_exit=False) as first:
        w = first.register("survivor")
        assert _push_journaled(w, 12) == 12
        ports = (first.port, first.data_port)
        first.proc.kill()
        first.proc.wait(timeout=HANG_S)
    journal = ckpt / "journal-0.log"
    data = bytearray(journal.read_bytes())
    data[len(data) // 2] ^= 0x10  # one bit in the middle: inside the 6th or 7th of 12 records
    journal.write_bytes(bytes(data))
    refused = _resume(ckpt)
    assert refused.returncode == 2, refused.stderr[-2000:]
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in refused.stderr, refused.stderr
    lost = int(lines[0].split("would lose ")[1].split(" ")[0])
    # Only the damaged record: the records after it are verified by their own checksums and replayed.
    assert lost == 1 and "--resume-truncate-corrupt" in lines[0], lines
    assert "6 intact record(s)" in lines[0] or "5 intact record(s)" in lines[0], lines  # after the 6th or 7th
    assert journal.read_bytes() == bytes(data)  # refused: nothing touched
    with running_server(tmp_path / "second", "--resume", str(ckpt), "--resume-truncate-corrupt",
                        ports=ports) as second:
        resumed = second.get_json("/v1/status")["resumed_from"]
        assert resumed["replayed_updates"] == 12 - lost and resumed["dropped_updates"] == lost
        # The skipped version is kept as an empty step: versions go on as acknowledged.
        assert resumed["version"] == 12
        assert "skipped as lost updates" in second.log_text()
        assert (ckpt / "journal-0.log.damaged").read_bytes() == bytes(data)
        w2 = second.register("survivor")
        assert w2.id == w.id
        assert _push_journaled(w2, 1, seed=9) == 13


@pytest.mark.parametrize("damage", ["truncated", "missing"])
def test_a_damaged_checkpoint_model_file_is_one_line_and_exit_2(tmp_path, damage):
    ckpt = tmp_path / "ckpt"
    with running_server(tmp_path / "first", "--checkpoint-dir", str(ckpt), "--checkpoint-interval", "3600"):
        pass  # SIGTERM: a checkpoint at version 0
    meta = json.loads((ckpt / "checkpoint.json").read_text())
    model = ckpt / meta["model_file"]
    if damage == "missing":
        model.unlink()
    else:
        model.write_bytes(model.read_bytes()[: model.stat().st_size // 2])
    proc = _resume(ckpt)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert ("is missing" if damage == "missing" else "truncated") in lines[0], lines


def test_quarantine_ignores_a_burst_and_releases_on_probation_and_by_the_operator(tmp_path):
    # 0.2 s between counted refusals (1 s by default) keeps the test short; the rule is the same.
    env = {"HERMES_SCREENING__QUARANTINE__MIN_GAP_SECONDS": "0.2"}
    with running_server(tmp_path / "srv", env=env) as srv:
        honest, attacker = srv.register("honest"), srv.register("attacker")
        gen = torch.Generator().manual_seed(1)

        def honest_step() -> None:
            v, _ = honest.pull()
            body = honest.push(_HONEST * torch.randn(honest.numel, generator=gen), base_version=v).header.body
            assert body["status"] == "applied", body

        def attack(scale: float) -> dict:
            v, _ = attacker.pull()
            msg = attacker.push(scale * _HONEST * torch.randn(attacker.numel, generator=gen), base_version=v)
            assert msg.header.type is MsgType.PUSH_REPLY
            return msg.header.body

        for _ in range(6):  # history for the median
            honest_step()
        # A burst: five huge pushes as fast as the wire allows (the 70 ms), no honest push between.
        burst = [attack(1e4) for _ in range(5)]
        assert all(b["status"] == "rejected" for b in burst), burst
        assert attack(1.0)["status"] == "applied"  # not quarantined
        assert srv.get_json("/v1/status")["screening"]["quarantined"] == []
        # Refusals spread over time and cycles: quarantined.
        for _ in range(40):
            honest_step()
            time.sleep(0.25)  # scenario pacing: the spread of the attack, not a wait for a result
            if "quarantined" in attack(1e4).get("reason", ""):
                break
        assert srv.get_json("/v1/status")["screening"]["quarantined"] == [attacker.id]
        assert srv.workers()[attacker.id]["quarantined"] is True
        # Probation: honest updates are screened but not folded, and the third in a row releases it.
        replies = [attack(1.0) for _ in range(3)]
        assert [r["status"] for r in replies] == ["rejected", "rejected", "applied"], replies
        assert "1/3" in replies[0]["reason"] and "2/3" in replies[1]["reason"], replies
        assert srv.workers()[attacker.id]["quarantined"] is False
        assert srv.workers()[honest.id]["quarantined"] is False
        assert [e["by"] for e in _events(srv, "worker_released")] == ["probation"]
        # Quarantined again, then released by the operator (admin token only).
        for _ in range(40):
            honest_step()
            time.sleep(0.25)  # scenario pacing, as above
            if "quarantined" in attack(1e4).get("reason", ""):
                break
        url = f"{srv.url}/v1/workers/{attacker.id}/release"
        assert srv.http.post(url, headers={"Authorization": f"Bearer {JOIN_TOKEN}"}).status_code == 401
        assert srv.http.post(url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).status_code == 200
        assert srv.http.post(url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).status_code == 409
        assert attack(1.0)["status"] == "applied"
        assert [e["by"] for e in _events(srv, "worker_released")] == ["probation", "operator"]
        # The thresholds are not for anyone: the median norm needs a token.
        assert "median_norm" not in srv.get_json("/v1/status")["screening"]
        r = srv.http.get(srv.url + "/v1/status", headers={"Authorization": f"Bearer {JOIN_TOKEN}"})
        assert r.json()["screening"]["median_norm"] > 0


def test_an_agent_drops_non_finite_cycles_and_gives_up_after_n_in_a_row(tmp_path):
    # An lr no model survives: every cycle from the global model diverges again.
    with running_server(tmp_path / "srv", sets=("eval_interval_seconds=0.5", "lr=1e12")) as srv:
        agent = _agent(srv.url, "diverging", tmp_path / "d.log", tmp_path / "state", "--max-nonfinite-cycles", "3")
        try:
            code = agent.wait(timeout=HANG_S)
        finally:
            kill_agents([agent])
        log = (tmp_path / "d.log").read_text()
        assert code == 4, log[-3000:]
        assert "cycle dropped, taking the global model again (1/3 in a row)" in log, log[-3000:]
        assert "(2/3 in a row)" in log
        last = [ln for ln in log.splitlines() if ln.startswith("hermes-client:")]
        assert len(last) == 1 and "not finite in 3 cycles in a row" in last[0], last
        assert "Traceback" not in log
        # Nothing non-finite reached the server.
        assert srv.workers() and all(w["rejected"] == 0 for w in srv.workers().values())
