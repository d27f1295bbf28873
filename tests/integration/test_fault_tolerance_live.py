"""Fault tolerance against a live server: silent workers are marked lost and
rejoin, checkpoints survive a SIGKILL with every acknowledged update, and
resuming refuses the wrong directories."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest
import torch

from hermes.common.wire import ErrorCode, MsgType
from tests.conftest import _server_env, running_server, wait_for

pytestmark = pytest.mark.integration


def _events(server, name: str) -> list[dict]:
    lines = (server.out_dir / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == name]


def test_silent_worker_is_lost_barrier_released_shards_requeued_and_it_rejoins(server_factory):
    # Plain BSP (no round deadline): the barrier must be released by the loss, nothing else.
    srv = server_factory("--preset", "bsp", "--heartbeat-interval", "0.25", "--heartbeat-timeout", "2",
                         "--set", "bsp.deadline=false")
    a, b = srv.register("steady"), srv.register("flaky")
    v0, m0 = a.pull()
    b_last = time.monotonic()  # the server last heard from the flaky worker no earlier than this
    work = b.request(MsgType.REQUEST_WORK)
    lost_shards = work.header.body["shards"]
    assert lost_shards

    stop_beats = threading.Event()

    def beat() -> None:  # the steady worker's agent would do this from its heartbeat thread
        while not stop_beats.wait(0.25):
            srv.http.post(f"{srv.url}/v1/workers/{a.id}/heartbeat", headers={"X-Hermes-Token": a.token})

    beats = threading.Thread(target=beat, daemon=True)
    beats.start()
    try:
        # BSP: this push waits at the barrier for the flaky worker, which never pushes.
        reply = a.push(torch.full((a.numel,), 0.125), base_version=v0)
        waited = time.monotonic() - b_last
    finally:
        stop_beats.set()
        beats.join()
    assert reply.header.type is MsgType.PUSH_REPLY and reply.header.body["status"] == "applied", reply.header.body
    # Released by the loss, so not before the flaky worker was silent for the timeout (2 s); how soon
    # after is the monitor's period plus this machine's load, not asserted (issue 32).
    assert waited >= 2.0, f"the barrier was released {waited:.1f}s after the flaky worker's last message"
    workers = srv.workers()
    assert workers[b.id]["state"] == "lost" and workers[a.id]["state"] == "active"
    assert srv.counter("hermes_workers_lost_total") == 1
    (leave,) = [e for e in _events(srv, "leave") if e["worker"] == b.id]
    assert leave["state"] == "lost" and sorted(leave["requeued_shards"]) == sorted(lost_shards)

    # Its unfinished shards are handed out first to whoever asks next.
    nxt = a.request(MsgType.REQUEST_WORK).header.body["shards"]
    assert nxt[: len(lost_shards)] == lost_shards

    # The lost worker's data-plane messages are refused until it registers again.
    refused = b.other_session().request(MsgType.PULL_MODEL)
    assert refused.header.type is MsgType.ERROR and refused.header.body["code"] == ErrorCode.UNAUTHORIZED.value
    assert "lost" in refused.header.body["message"]
    beat_reply = srv.http.post(f"{srv.url}/v1/workers/{b.id}/heartbeat", headers={"X-Hermes-Token": b.token})
    assert beat_reply.status_code == 410

    # It rejoins under the same name, gets its id back with a new secret, and catches up.
    again = srv.register_raw("flaky")
    assert again["worker_id"] == b.id and again["rejoined"] is True and again["token"] != b.token
    b2 = srv.register("flaky")
    version, model = b2.pull()
    assert version == v0 + 1 and torch.equal(model, m0 + 0.125)
    assert srv.workers()[b.id]["state"] == "active"


def test_heartbeats_keep_a_quiet_worker_alive(server_factory):
    srv = server_factory("--heartbeat-interval", "0.25", "--heartbeat-timeout", "1")
    w = srv.register("quiet-but-alive")
    for _ in range(12):  # 3 s: three timeouts
        r = srv.http.post(f"{srv.url}/v1/workers/{w.id}/heartbeat", headers={"X-Hermes-Token": w.token})
        assert r.status_code == 200 and r.json()["state"] == "active"
        time.sleep(0.25)
    assert srv.workers()[w.id]["state"] == "active"
    bad = srv.http.post(f"{srv.url}/v1/workers/{w.id}/heartbeat", headers={"X-Hermes-Token": "nope"})
    assert bad.status_code == 401


def _push_distinct(worker, n: int) -> tuple[int, torch.Tensor]:
    v, _ = worker.pull()
    for i in range(n):
        delta = torch.linspace(-1, 1, worker.numel) * (i + 1) * 1e-3
        reply = worker.push(delta.half() if i % 2 else delta, base_version=v)
        assert reply.header.body["status"] == "applied"
        v = reply.header.model_version
    return worker.pull()


@pytest.mark.parametrize("durable", [True, False], ids=["durable-acks", "no-durable-acks"])
def test_sigkill_then_resume_keeps_every_acknowledged_update(tmp_path, durable):
    """Durable acks: the resumed model is bit-identical to the last acknowledged one.
    Without them the window of loss is exactly the updates since the last checkpoint."""
    ckpt = tmp_path / "ckpt"
    flags = ["--checkpoint-dir", str(ckpt), "--checkpoint-interval", "3600"] + ([] if durable else ["--no-durable-acks"])
    with running_server(tmp_path / "first", *flags, check_exit=False) as first:
        w = first.register("survivor")
        acked_version, acked_model = _push_distinct(w, 7)
        assert acked_version == 7
        t_last = time.time()
        run_start = t_last - first.get_json("/v1/status")["elapsed_seconds"]
        asked = time.time() - t_last  # the request's own time: run_start is known to within it
        ports = (first.port, first.data_port)
        first.proc.kill()  # no shutdown hook runs: only what was durable survives
        first.proc.wait(timeout=10)
        t_kill = time.time()
    meta = json.loads((ckpt / "checkpoint.json").read_text())
    assert meta["version"] == 0  # only the start-up checkpoint was written
    with running_server(tmp_path / "second", "--resume", str(ckpt), ports=ports) as second:
        t_status = time.time()
        status = second.get_json("/v1/status")
        asked += time.time() - t_status
        # The run's clock: training seconds plus the downtime (from the last journaled fold,
        # else the checkpoint, to the resume) add up to the wall-clock time since it started.
        downtime = status["resumed_from"].pop("downtime_seconds")
        assert status["downtime_seconds"] == downtime
        assert downtime >= (t_kill - t_last if durable else t_kill - run_start) - 0.5, (downtime, t_kill - t_last)
        # Within 1 s, plus the two status requests' own time (seconds on a loaded machine, issue 32).
        assert status["elapsed_seconds"] + downtime == pytest.approx(t_status - run_start, abs=1.0 + asked)
        w2 = second.register("survivor")
        assert w2.id == w.id  # ids stay with names across the restart
        version, model = w2.pull()
        if durable:
            assert status["resumed_from"] == {"checkpoint_version": 0, "replayed_updates": 7, "version": 7}
            assert version == acked_version and torch.equal(model, acked_model)
        else:
            assert status["resumed_from"] == {"checkpoint_version": 0, "replayed_updates": 0, "version": 0}
            assert version == 0
        # The run goes on from there: versions continue, not restart.
        reply = w2.push(torch.zeros(w2.numel), base_version=version)
        assert reply.header.model_version == version + 1
        # The old secret died with the old server.
        stale = w.other_session().request(MsgType.PULL_MODEL)
        assert stale.header.type is MsgType.ERROR and stale.header.body["code"] == "unauthorized"
    # SIGTERM wrote a final checkpoint at the last version.
    meta = json.loads((ckpt / "checkpoint.json").read_text())
    assert meta["version"] == version + 1
    # The server's own counts are checkpointed too (as of the checkpoint: the journal holds updates only).
    (survivor,) = [ident for ident in meta["workers"] if ident["id"] == w.id]
    assert survivor["counters"]["pushes"] == 1 and survivor["counters"]["applied"] == 1
    assert survivor["counters"]["pulls"] >= 1
    assert {p.name for p in ckpt.iterdir()} == {"checkpoint.json", f"model-{version + 1}.safetensors",
                                                f"journal-{version + 1}.log"}


def test_resume_refuses_wrong_directories(tmp_path):
    empty = tmp_path / "empty"
    proc = subprocess.run([sys.executable, "-m", "hermes.server.cli", "--resume", str(empty)],
                          capture_output=True, text=True, timeout=60, env=_server_env())
    assert proc.returncode == 2 and "no checkpoint there" in proc.stderr
    used = tmp_path / "used"
    used.mkdir()
    (used / "checkpoint.json").write_text(json.dumps({"format": 1, "version": 12}))
    proc = subprocess.run([sys.executable, "-m", "hermes.server.cli", "--checkpoint-dir", str(used)],
                          capture_output=True, text=True, timeout=60, env=_server_env())
    assert proc.returncode == 2 and "holds a checkpoint" in proc.stderr and "--resume" in proc.stderr


def test_agent_sigterm_at_a_barrier_abandons_the_wait_reports_and_leaves(server_factory, tmp_path):
    import os
    import signal

    from tests.conftest import JOIN_TOKEN

    # Plain BSP: the push stays held. No heartbeat timeout: under load the agent's start-up took longer than the
    # default 30 s, the silent member was marked lost and the barrier closed without it (a suite run saw version 2).
    srv = server_factory("--preset", "bsp", "--heartbeat-timeout", "0", "--set", "bsp.deadline=false")
    srv.register("never-pushes")  # holds every barrier: the agent's first push waits
    env = {**os.environ, "HERMES_JOIN_TOKEN": JOIN_TOKEN, "PYTHONUNBUFFERED": "1"}
    log = tmp_path / "agent.log"
    with open(log, "wb") as fh:
        agent = subprocess.Popen([sys.executable, "-m", "hermes.client.cli", "--server", srv.url, "--name",
                                  "terminated", "--no-progress"], stdout=fh, stderr=subprocess.STDOUT, env=env)
    try:
        wid = wait_for(lambda: next((w["id"] for w in srv.workers().values() if w["name"] == "terminated"), None),
                        60, "the agent to register")
        wait_for(lambda: srv.workers()[wid]["pushes"] >= 1, 90, "the agent's first push (held at the barrier)")
        agent.send_signal(signal.SIGTERM)
        # Exit 0, having left (below); how fast is not asserted (issue 32), a hang still fails.
        assert agent.wait(timeout=120) == 0, log.read_text()[-3000:]
    finally:
        if agent.poll() is None:
            agent.kill()
    rec = srv.workers()[wid]
    assert rec["state"] == "left" and rec["samples"] > 0, rec  # final stats delivered, then goodbye
    assert srv.healthz()["model_version"] == 0  # the held push was abandoned, not applied
    assert "Traceback" not in log.read_text()
