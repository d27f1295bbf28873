"""The regroup endpoint on a real server app (in process): who gets into the next generation, who is
refused and why, and that the allocator forgets the dropped worker."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from fastapi.testclient import TestClient

from hermes.server.app import create_app
from hermes.server.settings import ServerSettings

pytestmark = pytest.mark.integration

JOIN = "regroup-join-token-0123456789abcdef"


def _client(tmp_path, **run: Any) -> TestClient:
    settings = ServerSettings(preset="task-allocation", data_host="127.0.0.1", join_token=JOIN,
                              out_dir=str(tmp_path),
                              run={"topology": "collective", "world_size": 3, "collective_regroup_seconds": 1.0,
                                   # A silent member still counts as alive (no heartbeat timeout here): the
                                   # server waits for it up to the group timeout past the window.
                                   "collective_timeout_seconds": 2.0,
                                   "model": "mlp", **run})
    return TestClient(create_app(settings))


def _register(client: TestClient, name: str):
    return client.post("/v1/workers/register", json={"name": name}, headers={"Authorization": f"Bearer {JOIN}"})


def _regroup(client: TestClient, reg: dict, generation: int):
    return client.post(f"/v1/workers/{reg['worker_id']}/regroup", json={"generation": generation},
                       headers={"X-Hermes-Token": reg["token"]})


def test_survivors_get_dense_ranks_in_generation_1_and_the_others_are_refused(tmp_path) -> None:
    with _client(tmp_path) as client:
        regs = {n: _register(client, n).json() for n in ("a", "b", "c")}
        assert [regs[n]["collective"]["rank"] for n in "abc"] == [0, 1, 2]
        assert regs["a"]["collective"]["store_prefix"] == "gen0/"
        replies: dict[str, Any] = {}

        def report(name: str) -> None:
            replies[name] = _regroup(client, regs[name], 0)

        # b and c survive (a, rank 0, died silently); the group forms without a after 1 + 2 s.
        threads = [threading.Thread(target=report, args=(n,)) for n in ("c", "b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert {n: r.status_code for n, r in replies.items()} == {"b": 200, "c": 200}
        rv = {n: r.json() for n, r in replies.items()}
        assert (rv["b"]["rank"], rv["c"]["rank"]) == (0, 1)  # old rank order, dense
        assert {(r["world_size"], r["generation"], r["store_prefix"]) for r in rv.values()} == {(2, 1, "gen1/")}

        workers = {w["name"]: w for w in client.get("/v1/workers").json()}
        assert workers["a"]["state"] == "lost" and workers["b"]["state"] == "active"
        # The dropped worker learns it if it comes back, and so does a replacement.
        late = _regroup(client, regs["a"], 0)
        assert late.status_code == 409 and "re-formed without it" in late.json()["detail"]
        replacement = _register(client, "d")
        assert replacement.status_code == 409 and "admits no new" in replacement.json()["detail"]
        bad = client.post(f"/v1/workers/{regs['b']['worker_id']}/regroup", json={"generation": -1},
                          headers={"X-Hermes-Token": regs["b"]["token"]})
        assert bad.status_code == 422 and "generation" in bad.text


def test_too_few_survivors_end_the_run(tmp_path) -> None:
    with _client(tmp_path, collective_min_world_size=2) as client:
        regs = {n: _register(client, n).json() for n in ("a", "b", "c")}
        reply = _regroup(client, regs["b"], 0)
        assert reply.status_code == 409 and "collective_min_world_size=2" in reply.json()["detail"]
        status = client.get("/v1/status").json()
        assert status["stopping"] is True, status
        assert _regroup(client, regs["c"], 0).status_code == 410  # the run is over


def test_regrouping_disabled_keeps_the_fail_fast_path(tmp_path) -> None:
    with _client(tmp_path, collective_regroup=False) as client:
        reg = _register(client, "a").json()
        reply = _regroup(client, reg, 0)
        assert reply.status_code == 409 and "collective_regroup=false" in reply.json()["detail"]
