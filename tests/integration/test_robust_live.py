"""Robust aggregation on a live server: one BSP step of five real data-plane pushes, one of
them poisoned, folded by the coordinate-wise median, journaled and served to the next pull."""

from __future__ import annotations

import json
import threading

import pytest
import torch

from hermes.common.wire import MsgType

pytestmark = pytest.mark.integration


# Five pushes: the median is the third value; Krum (f = 1) scores each by its 2 closest others,
# 0.002's (1e-6 + 1e-6 per parameter) uniquely the lowest.
VALUES = (0.001, 0.002, 0.003, 0.010, 5.0)


@pytest.mark.parametrize(("rule", "expected"), [("median", 0.003), ("krum", 0.002)])
def test_a_barrier_step_is_the_robust_rules_not_the_mean(server_factory, rule, expected):
    server = server_factory("--preset", "bsp", "--checkpoint-interval", "3600",
                            sets=("eval_interval_seconds=0.5", f"aggregation={rule}", "min_workers=5"),
                            screening_off_because="the poisoned update must reach the rule: screening would "
                                                  "refuse it first, and its bounds are tested on their own")
    workers = [server.register() for _ in VALUES]
    assert workers[0].run_config["aggregation"] == rule
    v0, w0 = workers[0].pull()
    replies: list = [None] * len(VALUES)
    errors: list[BaseException] = []

    def push(i: int, value: float) -> None:
        try:
            replies[i] = workers[i].push(torch.full((workers[i].numel,), value), base_version=v0)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    # The barrier holds each reply until all five pushed: one step from the five updates.
    threads = [threading.Thread(target=push, args=(i, v)) for i, v in enumerate(VALUES)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert all(r.header.type is MsgType.PUSH_REPLY and r.header.body["status"] == "applied" for r in replies)
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
