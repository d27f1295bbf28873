"""overlap_push on a real trainer (issue 31, lte's extra samples): the work trained while a push is in
flight is sent with the next push, once, and the local momentum survives the rebase after the pull.

The agent's own code path: ``LocalTrainer.train_cycle``, ``topology.update_of`` (the push's delta and its
codec with error feedback) and ``Session._adopt`` (the pull that rebases: DaSGD, client/overlap.py).
"""

from __future__ import annotations

import threading
import time
from types import MethodType, SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from hermes.client import topology
from hermes.client import trainer as trainer_module
from hermes.client.prefetch import Work
from hermes.client.session import AgentStats, Session
from hermes.client.trainer import LocalTrainer
from hermes.common.codecs import decode
from hermes.common.config import build_config
from hermes.common.policies import base as policies
from hermes.common.policies.gate import GateDecision
from hermes.common.tensors import spec_of
from hermes.common.wire import MsgType

HANG_S = 30.0  # a background pull on a fake client answers at once; this only bounds a hang


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


@pytest.mark.parametrize(("jump", "resets"), [(1.3, 0), (2.0, 1)])
def test_the_pushed_flat_given_to_the_load_decides_as_the_model_does(monkeypatch: pytest.MonkeyPatch, jump: float,
                                                                      resets: int):
    """A push's reply: the load's reset check reads the flat vector the push was made from (the same model,
    nothing trained since) instead of flattening the model again; the same decision, and the model loaded."""
    trainer = _trainer()
    trainer.train_cycle(*_data(1), batch_size=16)
    local = trainer.flat()
    flattened: list[int] = []
    real = trainer_module.flatten
    monkeypatch.setattr(trainer_module, "flatten", lambda *a, **k: flattened.append(1) or real(*a, **k))
    trainer.load(local * jump, local=local)
    assert flattened == [] and trainer.state_resets == resets
    assert torch.equal(real(trainer.model), local * jump)


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


class _HoldingGate:
    """The z-score gate's answer when the validation loss did not improve enough: hold (no resync)."""

    def observe(self, loss: float) -> GateDecision:
        return GateDecision(push=False, z=0.5, alpha=-1.3, silent_cycles=1, reason="above_threshold")


def test_overlap_pull_rebases_a_held_cycle_on_the_newer_model_keeping_every_unpushed_change():
    """overlap_pull (issue 31): a cycle the gate holds asks for the newer model in the background; the next
    cycle's end rebases on it against the base the local model trained from, so nothing unpushed is lost."""
    trainer = _trainer()
    old_base = trainer.flat().clone()
    newer = old_base + torch.linspace(-0.02, 0.02, old_base.numel())  # others' progress, folded meanwhile
    requests: list[tuple[Any, ...]] = []

    class Client:
        def request(self, type_: MsgType, body: dict[str, Any], **kw: Any) -> Any:
            requests.append((type_, body, kw["model_version"]))
            return _reply(newer, 9)

        def close(self) -> None:
            pass

    session = SimpleNamespace(outbox=object(), data_client=Client, base=old_base, version=3,
                              pull_dtype="float32", pull_codec=None, shapes=spec_of(trainer.model, "mlp").shapes)
    session.load_pull_reply = MethodType(Session.load_pull_reply, session)
    session._adopt = MethodType(Session._adopt, session)
    job = SimpleNamespace(trainer=trainer, gate=_HoldingGate(), from_baseline=False,
                          config=SimpleNamespace(overlap_push=True, overlap_pull=True))
    host = SimpleNamespace(stats=AgentStats(started=0.0), stop_requested=threading.Event(),
                           note_skipped_cycle=lambda job, session, cycle: None,
                           report_if_due=lambda job, session: None)
    validation = _data(9)
    pp = topology.PushPull(host, job, session, baseline=None, validation=validation, max_cycles=None,  # type: ignore[arg-type]
                           request_timeout=5.0)
    assert pp.overlap is not None
    x, y = _data(1)
    work = Work(epoch=0, shards=(0,), x=x, y=y, batch_size=16, lr=0.1, fetched_bytes=0)
    assert pp.finish_cycle(work, trainer.train_cycle(x, y, 16)) is None  # held: the pull goes out
    deadline = time.monotonic() + HANG_S
    while not pp.overlap.answered and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pp.overlap.answered
    assert [(t, b["if_newer"], v) for t, b, v in requests] == [(MsgType.PULL_MODEL, True, 3)]
    result = trainer.train_cycle(*_data(2), batch_size=16)  # trained while the pull was in flight
    unpushed = trainer.flat() - old_base  # both cycles' change: neither was pushed
    assert pp.finish_cycle(work, result) is None  # the reply is in: rebase (then held again, another pull)
    pp.overlap.close()
    assert session.version == 9 and torch.equal(session.base, newer) and host.stats.pulls == 1
    # The newer model plus every change since the old base, which the next push's delta (since base) carries whole.
    assert torch.allclose(trainer.flat(), newer + unpushed, atol=1e-6)
    assert torch.allclose(trainer.flat() - session.base, unpushed, atol=1e-6)
    assert trainer.state_resets == 0


def test_overlap_pull_needs_overlap_push():
    assert build_config("hermes", overlap_pull=True).overlap_pull
    with pytest.raises(ValueError, match="overlap_pull .* needs overlap_push"):
        build_config("hermes", overlap_push=False, overlap_pull=True)
