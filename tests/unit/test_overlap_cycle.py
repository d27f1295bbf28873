"""overlap_push on a real trainer (issue 31, lte's extra samples): the work trained while a push is in
flight is sent with the next push, once, and the local momentum survives the rebase after the pull.

The agent's own code path: ``LocalTrainer.train_cycle``, ``topology.update_of`` (the push's delta and its
codec with error feedback) and ``Session._adopt`` (the pull that rebases: DaSGD, client/overlap.py).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from hermes.client.session import Session
from hermes.client.trainer import LocalTrainer
from hermes.common.codecs import decode
from hermes.common.config import build_config
from hermes.common.policies import base as policies
from hermes.common.tensors import spec_of


def _trainer(momentum: float = 0.9) -> LocalTrainer:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    return LocalTrainer(model, lr=0.1, momentum=momentum, device=torch.device("cpu"), precision="fp32", seed=1)


def _data(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(64, 6, generator=g), torch.randint(0, 3, (64,), generator=g)


def _reply(model: torch.Tensor, version: int) -> Any:
    """A push reply whose pull is ``model`` in fp32 (what Session._adopt reads of one)."""
    return SimpleNamespace(payload=SimpleNamespace(flat=lambda: model.clone()),
                           header=SimpleNamespace(body={}, model_version=version))


def _session(trainer: LocalTrainer, version: int = 3) -> Any:
    """The part of a Session a pull touches: the model version and the base it trained from."""
    return SimpleNamespace(version=version, base=trainer.flat().clone(),
                           shapes=spec_of(trainer.model, "mlp").shapes)


def _buffers(trainer: LocalTrainer) -> list[torch.Tensor]:
    return [trainer.optimizer.state[p]["momentum_buffer"].clone() for p in trainer.model.parameters()]


def test_work_trained_while_the_push_is_in_flight_goes_with_the_next_push_once():
    trainer = _trainer()
    session = _session(trainer)
    base = session.base
    trainer.train_cycle(*_data(1), batch_size=16)  # cycle k: pushed
    pushed = trainer.flat()
    trainer.train_cycle(*_data(2), batch_size=16)  # cycle k+1: trained while the push is in flight
    in_flight = trainer.flat() - pushed
    assert float(in_flight.norm()) > 0
    # The server added 0.4 of cycle k (its loss-weighted share) and another worker's change.
    other = torch.linspace(-0.01, 0.01, base.numel())
    server = base + 0.4 * (pushed - base) + other
    Session._adopt(session, trainer, _reply(server, 5), pushed)
    assert session.version == 5 and torch.equal(session.base, server)
    # Not dropped: the local model is the server's plus exactly cycle k+1's progress ...
    assert torch.allclose(trainer.flat(), server + in_flight, atol=1e-6)
    # ... and not counted twice: the next push's delta (the change since the base) is that progress alone.
    assert torch.allclose(trainer.flat() - session.base, in_flight, atol=1e-6)


def test_local_momentum_survives_the_rebase_and_carries_into_the_next_cycle():
    trainer = _trainer()
    session = _session(trainer)
    trainer.train_cycle(*_data(1), batch_size=16)
    pushed = trainer.flat()
    trainer.train_cycle(*_data(2), batch_size=16)
    before = _buffers(trainer)
    server = session.base + 0.4 * (pushed - session.base)
    Session._adopt(session, trainer, _reply(server, 4), pushed)
    assert trainer.state_resets == 0
    # Every momentum buffer is the one the last step left, untouched by the load.
    assert all(torch.equal(a, b) for a, b in zip(before, _buffers(trainer)))
    # And it moves the next cycle: the same cycle from the same weights with fresh state steps elsewhere.
    fresh = _trainer()
    fresh.load(trainer.flat())
    start = trainer.flat()
    trainer.train_cycle(*_data(3), batch_size=64)  # one step of all 64 samples: the same gradient for both
    fresh.train_cycle(*_data(3), batch_size=64)
    kept, reset = trainer.flat() - start, fresh.flat() - start
    assert not torch.allclose(kept, reset, atol=1e-6)
    # With momentum 0.9 the kept step is the fresh one plus 0.9 * lr times the carried buffer.
    carried = torch.cat([b.flatten() for b in before])
    assert torch.allclose(kept, reset - 0.1 * 0.9 * carried, atol=1e-5)


def test_only_a_far_jump_resets_the_momentum():
    trainer = _trainer()
    trainer.train_cycle(*_data(1), batch_size=16)
    here = trainer.flat()
    trainer.load(here * 1.3)  # 30% away: a normal pull keeps the state (optimizer_reset_jump 0.5)
    assert trainer.state_resets == 0
    trainer.load(here * 2.0)  # 0.7 / 1.3 = 54% away: reset
    assert trainer.state_resets == 1 and not trainer.optimizer.state


@pytest.mark.parametrize("ratio", [0.05, 0.25])
def test_error_feedback_and_the_rebase_lose_nothing_and_send_nothing_twice(ratio: float):
    """top-k with error feedback across an overlapped push: what the server received plus the residual
    still held is the agent's whole progress, cycle k and the in-flight cycle k+1."""
    config = build_config("hermes", **{"compression.push": "topk", "topk.ratio": ratio})
    codec = policies.build("compression", config.compression.push, config.core, config.sections())
    trainer = _trainer()
    session = _session(trainer)
    shapes = session.shapes
    base = session.base
    trainer.train_cycle(*_data(1), batch_size=16)
    pushed = trainer.flat()
    first = codec.encode(pushed - base, shapes)
    sent1 = decode(first.data, first.spec, shapes)
    trainer.train_cycle(*_data(2), batch_size=16)
    progress = trainer.flat() - base  # cycles k and k+1
    server = base + sent1  # share 1: the server holds exactly what arrived
    Session._adopt(session, trainer, _reply(server, 4), pushed)
    second = codec.encode(trainer.flat() - session.base, shapes)
    sent2 = decode(second.data, second.spec, shapes)
    residual = codec.state_dict()["residual"]
    assert torch.allclose(sent1 + sent2 + residual, progress, atol=1e-5)
    assert float(residual.norm()) > 0  # top-k held something back: the sum above is not vacuous
