"""client/topology.py: the collective agent gives up on groups that break before their first step, and only
on those; the topologies' hooks return why the loop stops (the loop returns it to the agent)."""

from __future__ import annotations

import math
import threading
from types import SimpleNamespace

import pytest
import torch

from hermes.client import topology
from hermes.client.prefetch import Work
from hermes.client.session import AgentStats
from hermes.client.trainer import CycleResult
from hermes.common.messages import LOSS_NOT_FINITE


def _all_reduce(monkeypatch: pytest.MonkeyPatch, regroups: list[str]) -> topology.AllReduce:
    ar = object.__new__(topology.AllReduce)
    ar.first = "rv0"
    ar.job = SimpleNamespace(trainer=SimpleNamespace(device="cuda:0"),
                             config=SimpleNamespace(collective=SimpleNamespace(regroup=True)))
    ar.session = SimpleNamespace(group=None)
    ar.host = SimpleNamespace(stats=SimpleNamespace(collective_bytes=0))

    def regroup(rv: str, failure: Exception) -> tuple[str, str]:
        regroups.append(rv)
        return f"rv{len(regroups)}", ""

    monkeypatch.setattr(ar, "_regroup", regroup)
    return ar


class _Group:
    reduced_bytes = 0

    def __init__(self, rv: str, device: str) -> None:
        self.rv = rv

    def close(self) -> None:
        pass


def test_generations_that_never_broadcast_end_the_agent_with_the_cause(monkeypatch: pytest.MonkeyPatch) -> None:
    regroups: list[str] = []
    ar = _all_reduce(monkeypatch, regroups)
    monkeypatch.setattr(topology, "CollectiveGroup", _Group)

    def broadcast_fails(group: _Group, rv: str) -> None:
        raise topology.CollectiveError("broadcast failed: NCCL error: unhandled cuda error")

    monkeypatch.setattr(ar, "_start_generation", broadcast_fails)
    with pytest.raises(topology.CollectiveError,
                       match=f"{topology.STILLBORN_GENERATIONS} generations in a row broke before their first "
                             "step; the last: broadcast failed: NCCL error"):
        ar.train()
    assert regroups == [f"rv{i}" for i in range(topology.STILLBORN_GENERATIONS - 1)]


def test_generations_that_trained_before_breaking_keep_regrouping(monkeypatch: pytest.MonkeyPatch) -> None:
    regroups: list[str] = []
    ar = _all_reduce(monkeypatch, regroups)
    monkeypatch.setattr(topology, "CollectiveGroup", _Group)
    monkeypatch.setattr(ar, "_start_generation", lambda group, rv: None)
    breaks = 2 * topology.STILLBORN_GENERATIONS

    def cycles(host: object, job: object, session: object, top: object) -> str:
        if len(regroups) < breaks:
            raise topology.CollectiveError("a peer died")
        return "the collective group agreed to stop"

    monkeypatch.setattr(topology, "run_cycles", cycles)
    assert ar.train() == "the collective group agreed to stop"
    assert len(regroups) == breaks


@pytest.mark.parametrize("loss", [math.nan, math.inf])
def test_a_diverged_cycle_is_dropped_and_the_global_model_taken_until_the_agent_gives_up(loss: float) -> None:
    sent: list[object] = []
    pulls: list[bool] = []
    noted: list[object] = []
    resets: list[int] = []
    trainer = SimpleNamespace(flat=lambda: torch.ones(2), reset_state=lambda: resets.append(1))
    job = SimpleNamespace(trainer=trainer, gate=None, from_baseline=False, wire_dtype=torch.float32,
                          config=SimpleNamespace(overlap_push=False), spec=None)
    session = SimpleNamespace(outbox=None, data_client=SimpleNamespace(request=lambda *a, **k: sent.append(a)),
                              base=torch.zeros(2), version=0,
                              pull=lambda tr, st, force, **k: pulls.append(force))
    host = SimpleNamespace(stats=AgentStats(started=0.0), stop_requested=threading.Event(),
                           note_skipped_cycle=lambda job, session, cycle: noted.append(cycle),
                           report_if_due=lambda job, session: None)
    pp = topology.PushPull(host, job, session, baseline=None, validation=None, max_cycles=None, request_timeout=1.0,
                           max_nonfinite=3)
    work = Work(epoch=0, shards=(0,), x=torch.zeros(2, 1), y=torch.zeros(2, dtype=torch.int64), batch_size=2,
                lr=0.1, fetched_bytes=0, cycle_samples=2, accumulation=1)
    bad = CycleResult(samples=2, steps=3, loss=loss, compute_seconds=0.01, wait_seconds=0.0, stopped=False)
    for _ in range(2):
        assert pp.finish_cycle(work, bad) is None
    # Each dropped: nothing sent, the global model pulled again, the optimizer's moments reset.
    assert sent == [] and pulls == [True, True] and len(resets) == 2
    assert [c.decision for c in noted] == [LOSS_NOT_FINITE, LOSS_NOT_FINITE] and not any(c.pushed for c in noted)
    assert host.stats.nonfinite_cycles == 2
    with pytest.raises(topology.LossNotFinite, match=r"not finite in 3 cycles in a row .* after 3 steps"):
        pp.finish_cycle(work, bad)
    assert sent == [] and host.stats.nonfinite_cycles == 3


def test_the_servers_quarantine_reason_is_logged_at_info_once_and_the_release_too(caplog) -> None:
    job = SimpleNamespace(trainer=None, config=SimpleNamespace(overlap_push=False))
    session = SimpleNamespace(outbox=None, pull=lambda *a, **k: None)
    host = SimpleNamespace(stats=AgentStats(started=0.0), stop_requested=threading.Event())
    pp = topology.PushPull(host, job, session, baseline=None, validation=None, max_cycles=None, request_timeout=1.0)
    held = "rejected: worker w0002 is quarantined; this update passed screening (1/3 needed for release)"
    replies = [{"status": "rejected", "reason": held}, {"status": "rejected", "reason": held},
               {"status": "rejected", "reason": "rejected: norm 9 > 32 × median 0.1"},
               {"status": "rejected", "reason": held}, {"status": "applied"}]
    caplog.set_level("INFO", logger="hermes.client.topology")
    for body in replies:
        assert pp._receive(SimpleNamespace(header=SimpleNamespace(body=body)), pushed=None) is None
    st = host.stats
    assert (st.pushes, st.applied, st.rejected, st.refused, st.quarantined_refusals) == (5, 1, 4, 4, 3)
    infos = [r.getMessage() for r in caplog.records if r.levelname == "INFO"]
    assert infos == [f"the server refused this update: {held}", f"the server refused this update: {held}",
                     "the server applies this worker's updates again (3 refused while it was quarantined)"]


def test_an_agent_whose_every_push_was_refused_does_not_exit_0(capsys) -> None:
    from hermes.client import cli

    stats = AgentStats(started=0.0, pushes=7, rejected=7, refused=7, quarantined_refusals=5,
                       last_refusal="rejected: worker w0002 is quarantined")
    agent = SimpleNamespace(run=lambda: stats, stop_reason="server asked to stop")
    assert cli._run(agent, "edge") == cli.EXIT_REMOTE
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["hermes-client: the server refused all 7 updates of this agent; the last reason: "
                   "rejected: worker w0002 is quarantined"]
    stats.refused = 6  # one was abandoned at the stop: not every push was refused for what it was
    assert cli._run(agent, "edge") == cli.EXIT_OK
    stats.refused, stats.applied = 7, 1
    assert cli._run(agent, "edge") == cli.EXIT_OK
