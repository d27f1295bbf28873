"""The hermes preset on a live server: loss-weighted blends under concurrent
pushes (no lost update, no torn model), per-cycle reports, and straggler
resizing that reaches the worker's next assignment."""

from __future__ import annotations

import json
import threading

import pytest
import torch

from hermes.common.wire import MsgType
from tests.conftest import kill_agents, running_server, start_agent

pytestmark = pytest.mark.integration


def _cycle(dss: int, batch_size: int, seconds: float, pushed: bool, z: float | None = -2.0) -> dict:
    return {"dss": dss, "batch_size": batch_size, "compute_seconds": seconds, "val_loss": 1.0, "z": z, "alpha": -1.3,
            "pushed": pushed, "decision": "zscore" if pushed else "above_threshold"}


@pytest.fixture(scope="module")
def hermes_server(server_factory):
    # The paper's configuration: Eq. 6 blends whole models (the default preset adds since-pull deltas).
    return server_factory("--preset", "hermes-paper", sets=("eval_interval_seconds=0.5", "rebalance_min_observations=2"))


def test_concurrent_pushes_are_blended_one_at_a_time(hermes_server):
    workers = [hermes_server.register() for _ in range(4)]
    assert workers[0].run_config["aggregation"] == "loss"
    v0, w0 = workers[0].pull()
    assert v0 == 0
    applied: list[tuple[int, torch.Tensor]] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def pusher(i: int) -> None:
        gen = torch.Generator().manual_seed(100 + i)
        try:
            for _ in range(5):
                g = 0.01 * torch.randn(workers[i].numel, generator=gen)
                reply = workers[i].push(g, base_version=0, cycle=_cycle(128, 32, 0.1, True))
                assert reply.header.type is MsgType.PUSH_REPLY, reply.header
                assert reply.header.body["status"] == "applied", reply.header.body
                with lock:
                    applied.append((reply.header.model_version, g))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=pusher, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    versions = sorted(v for v, _ in applied)
    assert versions == list(range(1, 21))  # every push is exactly one step: nothing lost or merged

    # Replay Hermes Eq. 6 in version order with the weights the server logged.
    events = [json.loads(line) for line in (hermes_server.out_dir / "events.jsonl").read_text().splitlines()]
    steps = {e["version"]: e for e in events if e["event"] == "update_applied"}
    assert steps[1]["weights"] == [1.0]  # Alg. 2 initial step: sigma <- G
    model = w0.clone()
    for version, g in sorted(applied, key=lambda t: t[0]):
        lam = steps[version]["weights"][0]
        assert 0.0 < lam <= 1.0
        if version > 1:
            # Share = T_g / (T_g + T_w) (Eq. 5) from the logged losses; 6 decimals are logged.
            expected = steps[version]["global_loss"] / (steps[version]["global_loss"] + steps[version]["candidate_loss"])
            assert lam == pytest.approx(expected, abs=2e-6)
        model = (1 - lam) * model + lam * (w0 + g)
    version, final = workers[0].pull()
    assert version == 20
    assert torch.allclose(final, model, atol=1e-4), (final - model).abs().max()

    assert hermes_server.counter("hermes_blend_weight_count") == 20
    # One candidate scoring per push, plus one global scoring per version after the first.
    assert hermes_server.counter("hermes_loss_eval_seconds_count") >= 20 + 19
    for w in workers:  # gone workers leave the straggler statistics too
        r = hermes_server.http.post(f"{hermes_server.url}/v1/workers/{w.id}/leave", headers={"X-Hermes-Token": w.token})
        assert r.status_code == 200


def test_cycle_reports_feed_metrics_and_resize_the_fast_outlier(hermes_server):
    ws = [hermes_server.register() for _ in range(4)]
    base = ws[0].run_config["cycle_samples"]
    for w in ws:
        work = w.request(MsgType.REQUEST_WORK)
        assert work.header.body["cycle_samples"] == base and work.header.body["batch_size"] == 32
    # HL8-like cycle times at the base workload: cores 6, 6, 4, 32 -> slowdowns 5.33, 5.33, 8, 1.
    times = [5.33 * 0.1, 5.33 * 0.1, 8 * 0.1, 0.1]
    # Three cycles each: the first is warm-up (kept out of the statistics), then min_observations=2.
    for _ in range(3):
        for w, t in zip(ws, times):
            reply = w.request(MsgType.REPORT_STATS, body={
                "samples": 128, "compute_seconds": 1.0, "wait_seconds": 0.0, "prefetch_wait_seconds": 0.0,
                "bytes_sent": 10, "bytes_received": 10, "cycle": _cycle(base, 32, t, False, z=-0.5)})
            assert reply.header.type is MsgType.STATS_ACK, reply.header
    fast = ws[3]
    work = fast.request(MsgType.REQUEST_WORK).header.body
    # The search sized the fast worker's cycle up towards the median (0.533 s at 0.1 s per 128 samples).
    assert work["cycle_samples"] > base
    assert len(work["shards"]) * ws[0].run_config["shard_size"] >= work["cycle_samples"]
    slow = ws[0].request(MsgType.REQUEST_WORK).header.body
    assert slow["cycle_samples"] == base  # not an outlier: untouched

    info = hermes_server.workers()[fast.id]
    assert info["cycles"] == 3 and info["gate_skips"] == 3 and info["gate_pushes"] == 0
    assert info["dss"] == work["cycle_samples"]
    assert info["workload_history"][0][1:] == [base, 32]
    who = {"worker": info["name"], "worker_id": fast.id}  # per-worker series: the name people read, the id
    assert hermes_server.counter("hermes_gate_decisions_total", **who, decision="skip") == 3
    assert hermes_server.counter("hermes_worker_cycles_total", **who) == 3
    assert hermes_server.counter("hermes_straggler_resizes_total", **who, kind="fast") == 1
    assert hermes_server.counter("hermes_worker_dataset_size", **who) == work["cycle_samples"]
    events = [json.loads(line) for line in (hermes_server.out_dir / "events.jsonl").read_text().splitlines()]
    assert any(e["event"] == "resize" and e["worker"] == fast.id for e in events)


def test_validation_split_is_served_and_distinct_from_training(hermes_server):
    reg = hermes_server.register_raw()
    assert reg["validation_shards"]
    w = hermes_server.register()
    rec = w.request(MsgType.FETCH_SHARD, body={"shard": reg["validation_shards"][0], "split": "validation"})
    assert rec.header.type is MsgType.SHARD
    from hermes.common.shards import decode_record

    record = decode_record(memoryview(rec.payload.flat().numpy()))
    assert record.dataset.endswith("-validation") and record.samples > 0
    bad = w.request(MsgType.FETCH_SHARD, body={"shard": 0, "split": "test"})
    assert bad.header.type is MsgType.ERROR and bad.header.body["code"] == "bad_request"


def test_several_shards_in_one_fetch(hermes_server):
    from hermes.common.shards import decode_record

    w = hermes_server.register()
    reply = w.request(MsgType.FETCH_SHARD, body={"shards": [3, 0, 3]})
    assert reply.header.type is MsgType.SHARD
    lengths = reply.header.body["lengths"]
    raw = memoryview(reply.payload.flat().numpy())
    assert sum(lengths) == len(raw) and reply.header.body["shards"] == [3, 0, 3]
    ids, off = [], 0
    for n in lengths:
        ids.append(decode_record(raw[off : off + n]).shard)
        off += n
    assert ids == [3, 0, 3]
    single = w.request(MsgType.FETCH_SHARD, body={"shard": 0})
    assert bytes(single.payload.flat().numpy()) == bytes(raw[lengths[0] : lengths[0] + lengths[1]])
    for bad in ([], [0] * 257, [0, "1"], [0, 10_000], "0"):
        err = w.request(MsgType.FETCH_SHARD, body={"shards": bad})
        assert err.header.type is MsgType.ERROR and err.header.body["code"] == "bad_request", bad


def test_a_real_hermes_agent_sends_one_work_request_per_k_assignments_and_one_per_push(tmp_path):
    """combine_messages (the default): the agent's pulls, shard fetches and stats ride on its
    pushes and work requests; the server counts what was carried instead of sent."""
    cycles = 6
    # Pushes waited for (the default preset overlaps them, so a cycle may end with one in flight);
    # hermes-paper sends one request per purpose (the paper's), so combining is switched on here.
    with running_server(tmp_path / "srv", "--preset", "hermes-paper",
                        sets=("eval_interval_seconds=0.5", "stats_interval_seconds=0.1", "cycle_samples=64",
                              "shard_size=32", "combine_messages=true", "assignments_per_request=4")) as srv:
        agent = start_agent(srv.url, "solo", tmp_path / "solo.log", "--max-cycles", str(cycles))
        try:
            code = agent.wait(timeout=90)
        finally:
            kill_agents([agent])
        assert code == 0, (tmp_path / "solo.log").read_text(errors="replace")[-2000:]
        summary = srv.get_json("/v1/summary")
    sent, carried = summary["messages_by_type"], summary["carried_by_type"]
    (w,) = [w for w in summary["workers"] if w["name"] == "solo"]
    assert w["cycles"] == cycles and w["pushes"] >= 1
    # The preset's k assignments per work request (the prefetcher runs ahead by up to one
    # request and one queued assignment), their shards inside.
    k = summary["config"]["assignments_per_request"]
    handed = sent["request_work"] + carried.get("request_work", 0)
    assert k == 4 and handed == k * sent["request_work"] and cycles <= handed <= cycles + 2 * k
    assert 0 < carried["fetch_shard"] <= handed
    # FETCH_SHARD only for the gate's validation split, PULL_MODEL only for the first model,
    # REPORT_STATS only for the goodbye: every push answered its pull.
    assert sent.get("fetch_shard", 0) <= 1 and sent["pull_model"] == 1 and sent["report_stats"] == 1
    assert sent["push_update"] == w["pushes"] == carried["pull_model"]
    # The gate-skipped cycles reached the server all the same (its straggler detector needs them).
    assert carried.get("report_stats:cycle", 0) == w["gate_skips"] == cycles - w["pushes"]
    assert carried["report_stats"] >= 1 and w["samples"] > 0
    # The control plane is counted too: the fixture's probe and the agent registered, left, and so on.
    assert sent["register"] >= 2 and sent["leave"] >= 2
    assert summary["messages_total"] == sum(sent.values())


def test_pull_reference_adds_each_delta_by_its_loss_share(server_factory):
    """loss.reference pull (a deviation): w <- w + server_lr * a * delta, a = T_g^p / (T_g^p + T_c^p)
    with the candidate w + delta (the hermes preset's loss.sharpness p = 2); replayed from the logged losses."""
    srv = server_factory("--preset", "hermes", sets=("loss.reference=pull", "loss.server_lr=1.5",
                                                      "eval_interval_seconds=0.5"))
    workers = [srv.register() for _ in range(2)]
    _, w0 = workers[0].pull()
    gen = torch.Generator().manual_seed(7)
    pushed = []
    for i in range(6):
        g = 0.01 * torch.randn(workers[0].numel, generator=gen)
        reply = workers[i % 2].push(g, base_version=i, cycle=_cycle(128, 32, 0.1, True))
        assert reply.header.body["status"] == "applied", reply.header.body
        pushed.append(g)
    events = [json.loads(line) for line in (srv.out_dir / "events.jsonl").read_text().splitlines()]
    steps = {e["version"]: e for e in events if e["event"] == "update_applied"}
    assert steps[1]["weights"] == [1.0]  # the first push is applied whole
    model = w0.clone()
    for version, g in enumerate(pushed, start=1):
        lam = steps[version]["weights"][0]
        if version > 1:
            g_loss, c_loss = steps[version]["global_loss"], steps[version]["candidate_loss"]
            share = g_loss**2 / (g_loss**2 + c_loss**2)
            assert lam == pytest.approx(1.5 * share, abs=4e-6)
            assert lam > 0.5  # added, not blended: a convex share times 1.5
        model = model + lam * g
    version, final = workers[0].pull()
    assert version == 6
    assert torch.allclose(final, model, atol=1e-4), (final - model).abs().max()
