"""The fedasync preset on a live server: each push mixed in on arrival with
alpha_t = alpha * s(t - tau) (Xie et al. 2019, Alg. 1), the mix replayed exactly."""

from __future__ import annotations

import json
import math

import pytest
import torch

from hermes.common.wire import MsgType

pytestmark = pytest.mark.integration


def test_stale_pushes_are_mixed_by_staleness(server_factory):
    server = server_factory("--preset", "fedasync", sets=("eval_interval_seconds=0.5",))
    a, b = server.register(), server.register()
    assert a.run_config["aggregation"] == "fedasync"
    v0, w0 = a.pull()
    assert v0 == 0
    gen = torch.Generator().manual_seed(7)
    # (worker, base version): b pushes twice from v0, so its second update is one version behind;
    # a then pushes from v0 two versions behind.
    pushes = [(b, 0), (b, 0), (a, 0), (a, 3)]
    model, locals_ = w0.clone(), []
    for worker, base in pushes:
        g = 0.01 * torch.randn(worker.numel, generator=gen)  # x_new = w0 + g (a from-baseline update)
        reply = worker.push(g, base_version=base)
        assert reply.header.type is MsgType.PUSH_REPLY and reply.header.body["status"] == "applied", reply.header
        locals_.append(g)
    events = [json.loads(line) for line in (server.out_dir / "events.jsonl").read_text().splitlines()]
    steps = {e["version"]: e for e in events if e["event"] == "update_applied"}
    # alpha 0.6, polynomial a = 0.5, t - tau = versions behind + 1: 0.6 * 2^-0.5, 0.6 * 3^-0.5, 0.6 * 4^-0.5, fresh.
    expected = [0.6 / math.sqrt(2), 0.6 / math.sqrt(3), 0.6 / 2, 0.6 / math.sqrt(2)]
    for version, (g, alpha) in enumerate(zip(locals_, expected), start=1):
        assert steps[version]["weights"][0] == pytest.approx(alpha, abs=2e-6)
        model = (1 - alpha) * model + alpha * (w0 + g)
    version, final = a.pull()
    assert version == 4
    assert torch.allclose(final, model, atol=1e-5), (final - model).abs().max()
