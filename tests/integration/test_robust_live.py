"""Robust aggregation on a live server: one BSP step of five real data-plane pushes, one of
them poisoned, folded by the coordinate-wise median, journaled and served to the next pull;
after a SIGKILL the journal replays that step bit for bit."""

from __future__ import annotations

import json
import threading

import pytest
import torch

from hermes.common.wire import MsgType
from tests.conftest import running_server

pytestmark = pytest.mark.integration


# Five pushes: the median is the third value; Krum (f = 1) scores each by its 2 closest others,
# 0.002's (1e-6 + 1e-6 per parameter) uniquely the lowest.
VALUES = (0.001, 0.002, 0.003, 0.010, 5.0)


SCREENING_OFF = ("the poisoned update must reach the rule: screening would refuse it first, and its bounds are "
                 "tested on their own")


def _one_barrier_step(workers: list, base_version: int) -> None:
    """Each worker pushes its VALUES entry as a full delta; the barrier holds every reply until all have pushed."""
    replies: list = [None] * len(VALUES)
    errors: list[BaseException] = []

    def push(i: int, value: float) -> None:
        try:
            replies[i] = workers[i].push(torch.full((workers[i].numel,), value), base_version=base_version)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=push, args=(i, v)) for i, v in enumerate(VALUES)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert all(r.header.type is MsgType.PUSH_REPLY and r.header.body["status"] == "applied" for r in replies)


@pytest.mark.parametrize(("rule", "expected"), [("median", 0.003), ("krum", 0.002)])
def test_a_barrier_step_is_the_robust_rules_not_the_mean(server_factory, rule, expected):
    server = server_factory("--preset", "bsp", "--checkpoint-interval", "3600", "--set", "bsp.deadline=false",
                            sets=("eval_interval_seconds=0.5", f"aggregation={rule}", "min_workers=5"),
                            screening_off_because=SCREENING_OFF)
    workers = [server.register() for _ in VALUES]
    assert workers[0].run_config["aggregation"] == rule
    v0, w0 = workers[0].pull()
    _one_barrier_step(workers, v0)
    version, w1 = workers[0].pull()
    assert version == 1
    # The mean would have moved every parameter by 1.0032; the robust step ignores the 5.0.
    assert torch.allclose(w1 - w0, torch.full_like(w0, expected), atol=1e-6), (w1 - w0)[:4]
    events = [json.loads(line) for line in (server.out_dir / "events.jsonl").read_text().splitlines()]
    (step,) = [e for e in events if e["event"] == "update_applied"]
    assert len(step["workers"]) == len(VALUES)
    if rule == "krum":
        assert sorted(step["weights"]) == [0.0, 0.0, 0.0, 0.0, 1.0] and len(step["krum_scores"]) == len(VALUES)
    else:
        assert step["combined"] == "median"


# trimmed-mean takes the same combined-step path; opt-in (-m slow) to keep the default suite short.
@pytest.mark.parametrize("rule", ["median", pytest.param("trimmed-mean", marks=pytest.mark.slow)])
def test_a_combined_step_survives_sigkill_through_the_journal(tmp_path, rule):
    # A median / trimmed-mean step is one computed delta, journaled as an apply of it: replaying
    # the journal must give the acknowledged model bit for bit, not re-run the rule on nothing.
    ckpt = tmp_path / "ckpt"
    flags = ("--preset", "bsp", "--checkpoint-dir", str(ckpt), "--checkpoint-interval", "3600",
             "--set", "bsp.deadline=false")  # one round of all five, however loaded the machine
    sets = ("eval_interval_seconds=0.5", f"aggregation={rule}", "min_workers=5")
    with running_server(tmp_path / "first", *flags, sets=sets, screening_off_because=SCREENING_OFF,
                        check_exit=False) as first:
        workers = [first.register(f"w{i}") for i in range(len(VALUES))]
        v0, w0 = workers[0].pull()
        _one_barrier_step(workers, v0)
        acked_version, acked = workers[0].pull()
        assert acked_version == 1 and not torch.equal(acked, w0)
        ports = (first.port, first.data_port)
        first.proc.kill()  # no shutdown checkpoint: the step survives only in the journal
        first.proc.wait(timeout=10)
    assert json.loads((ckpt / "checkpoint.json").read_text())["version"] == 0
    with running_server(tmp_path / "second", "--resume", str(ckpt), *flags[:2], sets=sets,
                        screening_off_because=SCREENING_OFF, ports=ports) as second:
        resumed = second.get_json("/v1/status")["resumed_from"]
        resumed.pop("downtime_seconds")
        assert resumed == {"checkpoint_version": 0, "replayed_updates": 1, "version": 1}
        version, model = second.register("w0").pull()
        assert version == acked_version and torch.equal(model, acked)
