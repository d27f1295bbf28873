"""The fedbuff preset on a live server: pushes are acknowledged at once and
buffered; every K-th takes one step of eta_g * mean(s(tau_k) Delta_k)
(Nguyen et al. 2022, Alg. 1), replayed exactly."""

from __future__ import annotations

import json
import math

import pytest
import torch

from hermes.common.wire import MsgType

pytestmark = pytest.mark.integration


def test_buffered_deltas_step_once_per_k(server_factory):
    server = server_factory("--preset", "fedbuff", sets=("fedbuff.buffer_size=3", "fedbuff.server_lr=2.0"))
    a, b = server.register(), server.register()
    v0, w0 = a.pull()
    gen = torch.Generator().manual_seed(3)
    deltas = [0.01 * torch.randn(a.numel, generator=gen) for _ in range(6)]
    # a pushes twice without waiting for anyone (both in the first buffer); the 4th-6th are one version stale
    # but for a's last push, computed from v1.
    plan = [(a, 0), (a, 0), (b, 0), (b, 0), (a, 0), (a, 1)]
    versions = []
    for (worker, base), d in zip(plan, deltas):
        reply = worker.push(d, base_version=base)
        assert reply.header.type is MsgType.PUSH_REPLY and reply.header.body["status"] == "applied", reply.header
        versions.append(worker.pull()[0])
    assert versions == [0, 0, 1, 1, 1, 2]  # the model moves only on every third push
    # Step 1: tau = 0 for all: 2.0 / 3 each. Step 2: tau 1, 1, 0: 2/3 * (2^-0.5, 2^-0.5, 1).
    w1 = w0 + (2.0 / 3) * (deltas[0] + deltas[1] + deltas[2])
    s = 1 / math.sqrt(2)
    w2 = w1 + (2.0 / 3) * (s * deltas[3] + s * deltas[4] + deltas[5])
    version, final = a.pull()
    assert version == 2
    assert torch.allclose(final, w2, atol=1e-5), (final - w2).abs().max()
    events = [json.loads(line) for line in (server.out_dir / "events.jsonl").read_text().splitlines()]
    steps = [e for e in events if e["event"] == "update_applied"]
    assert [len(e["workers"]) for e in steps] == [3, 3] and steps[1]["staleness"] == [1, 1, 0]
