"""Late joiners, rejoins and restarts in the in-process engine (issue 28; docs/churn.md).

Every update must be folded against the model it was measured from. From-baseline
presets (fedasync, hermes-paper) push G = w_worker - w_base; the server keeps each
worker's base (server/engine/bases.py) and folds x_new = w_base + G. Since-pull
presets (hermes, fedbuff, bsp) push the change since the model of ``model_version``.

The training tests run real local SGD on a learnable toy task through ``Engine.handle``:
one agent trains alone until the model is good, a second joins late; at least half
of the late agent's pushes are applied and no evaluation after the join is more
than 0.1 below the one before it.
"""

from __future__ import annotations

import asyncio
import itertools
import math

import numpy as np
import pytest
import torch

from hermes.common.clock import ManualClock
from hermes.common.config import build_config
from hermes.common.datasets import ArrayDataset
from hermes.common.models import build_model
from hermes.common.task import Task
from hermes.common.tensors import flatten, load_flat
from hermes.common.wire import Header, MsgType, decode, encode
from hermes.server.engine import Engine
from hermes.server.engine.bases import Bases
from hermes.server.events import EventLog
from hermes.server.metrics import ServerMetrics

SHARD = 16
FEATURES, CLASSES = 8, 3


def _split(name: str, n: int, seed: int) -> ArrayDataset:
    """A learnable task: the class is the largest of the first three features."""
    rng = np.random.default_rng(seed)
    x = np.ascontiguousarray(rng.standard_normal((n, FEATURES)).astype(np.float32))
    return ArrayDataset(name, x, np.argmax(x[:, :CLASSES], axis=1).astype(np.int64), num_classes=CLASSES)


def _model() -> torch.nn.Module:
    return build_model("mlp", input_shape=(FEATURES,), num_classes=CLASSES)


def _biased_model() -> torch.nn.Module:
    """The server's initial model w0 answers class 0 for everything: a fold that drags the model back
    towards w0 shows in the accuracy (a plain random init is nearly scale-free: being pulled half
    way back to it hardly moves the argmax)."""
    torch.manual_seed(0)
    model = _model()
    last = [m for m in model.modules() if isinstance(m, torch.nn.Linear)][-1]
    with torch.no_grad():
        last.bias[0] += 4.0
    return model


class _Events(EventLog):
    """The event log, kept in memory."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__(None, clock=clock)
        self.seen: list[dict] = []

    def emit(self, event: str, **fields) -> None:
        self.seen.append({"event": event, **fields})


def _engine(preset: str, **overrides) -> Engine:
    clock = ManualClock()
    config = build_config(preset, model="mlp", shard_size=SHARD, eval_max_samples=64, **overrides)
    splits = (_split("toy", 1024, 0), _split("toy-validation", 256, 1), _split("toy-test", 512, 2))
    # Screening on, as a real server has it: the late joiner was refused by it.
    return Engine(config, metrics=ServerMetrics(), events=_Events(clock), max_workers=8,
                  max_message_bytes=1 << 24, splits=splits, clock=clock,
                  task=Task(model=_biased_model, name="toy"))


class _Agent:
    """An agent that trains for real: base pull at its registration, local SGD, push, pull."""

    _sessions = itertools.count()

    def __init__(self, engine: Engine, name: str, seed: int) -> None:
        self.engine = engine
        self.rec, _ = engine.register(name)
        self.session, self.seq = f"s{next(self._sessions)}", 0
        self.from_baseline = engine.config.pushes_from_baseline()
        self.model = _model()
        train = engine.train
        self.x, self.y = torch.as_tensor(train.x), torch.as_tensor(train.y)  # type: ignore[attr-defined]
        self.gen = torch.Generator().manual_seed(seed)
        self.version, self.pulled = 0, torch.empty(0)
        self.base_version, self.base = 0, torch.empty(0)
        self.pushes = self.applied = 0

    async def request(self, type_: MsgType, body: dict, *, payload: torch.Tensor | None = None,
                      model_version: int = 0):
        self.seq += 1
        header = Header(type=type_, worker=self.rec.id, session=self.session, seq=self.seq,
                        ts=int(self.engine.clock.time() * 1000), model_version=model_version, body=body,
                        shapes=self.engine.spec.shapes if payload is not None else ())
        return decode(await self.engine.handle(encode(header, payload, key=self.rec.key)))

    async def pull(self, *, base: bool = False, dtype: str = "float32") -> None:
        reply = await self.request(MsgType.PULL_MODEL, {"if_newer": False, "base": base, "dtype": dtype},
                                   model_version=self.version)
        flat = reply.payload.flat().float().clone()
        self.version, self.pulled = reply.header.model_version, flat
        load_flat(self.model, flat)
        if base:
            self.base_version, self.base = self.version, flat

    async def start(self) -> None:
        await self.pull(base=self.from_baseline)
        self.base_version, self.base = self.version, self.pulled

    def train(self, steps: int, batch: int = 32, lr: float = 0.1) -> int:
        opt = torch.optim.SGD(self.model.parameters(), lr=lr)
        for _ in range(steps):
            idx = torch.randint(0, len(self.y), (batch,), generator=self.gen)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(self.model(self.x[idx]), self.y[idx]).backward()
            opt.step()
        return steps * batch

    async def cycle(self, steps: int = 8) -> str:
        samples = self.train(steps)
        local = flatten(self.model)
        reference = self.base if self.from_baseline else self.pulled
        body: dict = {"samples": samples}
        if self.from_baseline:
            body["base_version"] = self.base_version
        reply = await self.request(MsgType.PUSH_UPDATE, body, payload=local - reference, model_version=self.version)
        status = reply.header.body["status"]
        self.pushes += 1
        self.applied += status == "applied"
        await self.pull()
        return str(status)


def _accuracy(engine: Engine) -> float:
    model = _model()
    _, flat = engine.state.snapshot()
    load_flat(model, flat)
    test = engine.test
    x, y = torch.as_tensor(test.x), torch.as_tensor(test.y)  # type: ignore[attr-defined]
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


async def _late_join(preset: str, *, together: bool) -> tuple[list[float], _Agent, int]:
    """A trains alone to 0.8, B joins; both train on. Evaluations after every round, the join's index."""
    engine = _engine(preset)
    a = _Agent(engine, "early", seed=1)
    await a.start()
    evals = [_accuracy(engine)]
    for _ in range(60):
        await a.cycle()
        evals.append(_accuracy(engine))
        if evals[-1] >= 0.8:
            break
    assert evals[-1] >= 0.8, f"{preset}: the early agent alone reached only {evals[-1]:.3f}"
    joined = len(evals) - 1
    b = _Agent(engine, "late", seed=2)
    await b.start()
    assert b.version == engine.version > 0
    for _ in range(10):
        if together:  # a barrier: both pushes of a round are held until the second arrives
            await asyncio.gather(a.cycle(), b.cycle())
        else:
            await b.cycle()
            await a.cycle()
        evals.append(_accuracy(engine))
    return evals, b, joined


@pytest.mark.parametrize(("preset", "together"), [
    ("fedasync", False), ("hermes-paper", False),  # from-baseline
    ("hermes", False), ("fedbuff", False),  # since-pull
    ("bsp", True),  # a barrier
])
def test_a_late_joiner_contributes_and_does_not_drag_the_model_back(preset, together):
    evals, late, joined = asyncio.run(_late_join(preset, together=together))
    assert late.applied * 2 >= late.pushes, f"{preset}: {late.applied} of {late.pushes} late pushes applied"
    drops = [(i, before, after) for i, (before, after) in enumerate(zip(evals[joined:], evals[joined + 1:]))
             if after < before - 0.1]
    assert not drops, f"{preset}: evaluations fell by more than 0.1 after the join: {drops} ({evals})"


def _mix(engine: Engine) -> float:
    """The weight of the last fold (FedAsync's alpha_t or Hermes' loss share) from the event log."""
    assert isinstance(engine.events, _Events)
    events = [e for e in engine.events.seen if e["event"] == "update_applied"]
    return float(events[-1]["weights"][0])


@pytest.mark.parametrize("preset", ["fedasync", "hermes-paper"])
def test_a_from_baseline_push_is_folded_as_w_base_plus_g(preset):
    """FedAsync Alg. 1 (x_t = (1 - a) x_{t-1} + a x_new) and Hermes Eq. 6 with x_new = w_base + G,
    w_base the late joiner's base pull, not w0."""

    async def go() -> None:
        engine = _engine(preset)
        a = _Agent(engine, "early", seed=1)
        await a.start()
        for _ in range(3):
            assert await a.cycle() == "applied"
        b = _Agent(engine, "late", seed=2)
        await b.start()
        w_base = b.base.clone()
        assert b.base_version == engine.version == 3 and engine.bases is not None and engine.bases.count == 1
        b.train(8)
        x_new = flatten(b.model)
        _, before = engine.state.snapshot()
        before = before.clone()
        reply = await b.request(MsgType.PUSH_UPDATE, {"samples": 256, "base_version": b.base_version},
                                payload=x_new - w_base, model_version=b.version)
        assert reply.header.body["status"] == "applied", reply.header.body
        alpha = _mix(engine)
        assert 0 < alpha <= 1
        _, after = engine.state.snapshot()
        expected = (1 - alpha) * before + alpha * x_new
        assert torch.allclose(after, expected, atol=1e-5), (after - expected).abs().max()
        # What the old fold computed, (1 - a) w + a (w0 + G), is far from it.
        wrong = (1 - alpha) * before + alpha * (engine.state.baseline + x_new - w_base)
        assert (wrong - expected).norm() > 10 * (after - expected).norm() + 1e-3

    asyncio.run(go())


def test_a_base_that_is_not_kept_is_refused_with_rebase_and_nothing_is_folded():
    async def go() -> None:
        engine = _engine("fedasync")
        a = _Agent(engine, "early", seed=1)
        await a.start()
        await a.cycle()
        await a.cycle()
        version = engine.version
        # Base version 1 was never this worker's base pull (a restarted server keeps none).
        reply = await a.request(MsgType.PUSH_UPDATE, {"samples": 32, "base_version": 1},
                                payload=torch.zeros(engine.spec.numel), model_version=a.version)
        body = reply.header.body
        assert body["status"] == "rejected" and body["rebase"] is True and "pull a new base" in body["reason"]
        assert engine.version == version

    asyncio.run(go())


def test_bases_are_kept_for_live_workers_only():
    """The bound: at most one base per live worker, none for a base at version 0 (w0 is kept anyway)."""

    async def go() -> None:
        engine = _engine("fedasync")
        assert engine.bases is not None
        a = _Agent(engine, "a", seed=1)
        await a.start()
        assert engine.bases.count == 0  # joined at version 0
        await a.cycle()
        late = [_Agent(engine, f"late{i}", seed=i + 2) for i in range(3)]
        for agent in late:
            await agent.start()
        assert engine.bases.count == 3
        await engine.leave(late[0].rec.id, "bye")
        await engine.leave(late[1].rec.id, "silent", state="lost")
        assert engine.bases.count == 1
        # The same name registering again starts with a new base pull: its old base is gone.
        again = _Agent(engine, "late2", seed=9)
        assert again.rec.id == late[2].rec.id and engine.bases.count == 0
        await again.start()
        assert engine.bases.count == 1
        assert engine.bases.base(again.rec.id, again.base_version) is not None
        assert engine.bases.base(again.rec.id, again.base_version + 1) is None

    asyncio.run(go())


def test_a_half_precision_base_is_kept_as_the_agent_widens_it():
    async def go() -> None:
        engine = _engine("fedasync")
        a = _Agent(engine, "early", seed=1)
        await a.start()
        await a.cycle()
        b = _Agent(engine, "late", seed=2)
        await b.pull(base=True, dtype="float16")
        assert engine.bases is not None
        kept = engine.bases.base(b.rec.id, b.version)
        assert kept is not None and kept.dtype == torch.float32
        assert torch.equal(kept, b.pulled)

    asyncio.run(go())


def test_since_pull_presets_keep_no_bases():
    assert _engine("hermes").bases is None
    assert _engine("fedbuff").bases is None
    assert _engine("bsp").bases is None


def test_rebased_is_exact_against_w0():
    gen = torch.Generator().manual_seed(0)
    w0, base, g = (torch.randn(1000, generator=gen) for _ in range(3))
    bases = Bases(w0)
    from hermes.common.wire import Payload

    out = bases.rebased(Payload(torch.float16, (g[:400].half(), g[400:].half()), ((1000,),)), base)
    assert out.dtype == torch.float32
    assert torch.allclose(w0 + out.flat(), base + g.half().float(), atol=1e-6)
    same = Payload(torch.float32, (g,), ((1000,),))
    assert bases.rebased(same, w0) is same
    assert math.isfinite(out.norm)
