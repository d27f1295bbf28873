"""loss.probe_rotation: each model version is scored on validation samples drawn for it (docs/simulation.md,
"Why hermes is slow late": on 8 fixed samples the global model's probe loss fell to 0.01 and the Eq. 5-6 share of
every whole delta collapsed)."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn
from torch.nn import functional as F

from hermes.common.clock import ManualClock
from hermes.common.config import build_config
from hermes.common.tensors import flatten, load_flat, spec_of
from hermes.common.wire import Payload
from hermes.server.lossprobe import LossProbe
from hermes.server.metrics import ServerMetrics
from hermes.server.state import ModelState
from tests.unit.test_engine_inprocess import _engine


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def _probe(rotate: bool, seed: int = 0) -> tuple[LossProbe, ModelState]:
    model = _model()
    spec = spec_of(model, "mlp")
    state = ModelState(spec, flatten(model))
    g = torch.Generator().manual_seed(1)
    validation = torch.utils.data.TensorDataset(torch.randn(500, 4, generator=g), torch.randint(0, 3, (500,), generator=g))
    task = SimpleNamespace(model=_model, loss=F.cross_entropy, transform=None)
    probe = LossProbe(task, spec, state, validation, samples=8, seed=seed,  # type: ignore[arg-type]
                      metrics=ServerMetrics(), rotate=rotate)
    return probe, state


def _step(state: ModelState) -> None:
    delta = torch.full((state.numel,), 0.01)
    state.apply([(Payload(dtype=torch.float32, chunks=(delta,), shapes=((delta.numel(),),)), 1.0)])


def _loss_on(state: ModelState, x: torch.Tensor, y: torch.Tensor) -> float:
    model = _model()
    load_flat(model, state.snapshot()[1])
    with torch.no_grad():
        return float(F.cross_entropy(model(x), y))


def test_without_rotation_every_version_is_scored_on_the_same_subset():
    probe, state = _probe(rotate=False)
    x0, y0 = probe.samples_for(0)
    _step(state)
    x1, _ = probe.samples_for(1)
    assert len(y0) == 8 and torch.equal(x0, x1)
    v, loss = probe.global_loss()
    assert v == 1 and abs(loss - _loss_on(state, x0, y0)) < 1e-6


def test_with_rotation_each_version_has_its_own_draw_deterministic_by_seed_and_version():
    probe, state = _probe(rotate=True)
    draws = [probe.samples_for(v)[0] for v in range(4)]
    assert all(len(d) == 8 for d in draws)
    assert all(not torch.equal(draws[i], draws[j]) for i in range(4) for j in range(i + 1, 4))
    again, _ = _probe(rotate=True)
    assert torch.equal(again.samples_for(2)[0], draws[2])  # the same seed and version: the same samples
    other, _ = _probe(rotate=True, seed=1)
    assert not torch.equal(other.samples_for(2)[0], draws[2])


def test_with_rotation_the_global_and_candidate_losses_use_the_current_versions_samples():
    probe, state = _probe(rotate=True)
    _step(state)
    _step(state)
    x2, y2 = probe.samples_for(2)
    v, loss = probe.global_loss()
    assert v == 2 and abs(loss - _loss_on(state, x2, y2)) < 1e-6
    probe.set_global(3, 123.0)  # measured on version 2's samples: not taken as version 3's loss
    _step(state)
    v, loss = probe.global_loss()
    x3, y3 = probe.samples_for(3)
    assert v == 3 and abs(loss - _loss_on(state, x3, y3)) < 1e-6
    zero = torch.zeros(state.numel)
    same = probe.candidate_loss(Payload(dtype=torch.float32, chunks=(zero,), shapes=((zero.numel(),),)),
                                from_current=True)
    assert abs(same - loss) < 1e-6  # the model plus nothing, on the same draw


def test_with_rotation_the_descent_direction_takes_gradients_on_samples_a_scoring_drew():
    # Screening's direction test (LossProbe.descent) after the loss of the same version was scored in inference
    # mode: the draw must be usable by autograd.
    probe, state = _probe(rotate=True)
    _step(state)
    probe.global_loss()
    direction = probe.descent()
    assert direction.shape == (state.numel,) and bool(torch.isfinite(direction).all())
    assert float(direction.abs().sum()) > 0


def test_the_config_switch_reaches_the_engines_probe():
    clock = ManualClock()
    on = _engine(clock, preset="hermes", **{"loss.probe_rotation": True, "loss.eval_samples": 8})
    assert on.policies.aggregation.probe is not None and on.policies.aggregation.probe._rotation is not None
    off = _engine(clock, preset="hermes")
    assert off.policies.aggregation.probe is not None and off.policies.aggregation.probe._rotation is None
    assert build_config("hermes").loss.probe_rotation is False
