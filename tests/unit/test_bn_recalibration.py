"""loss.bn_stats recalibrate: the loss probe measures a fold's BatchNorm statistics instead of adding them up.

Added at a share, running statistics stop describing the folded weights (docs/compression.md, "BatchNorm
statistics"): here a delta that scales the first layer by 10 and its running variance by 100, folded at a
share of 0.2, leaves a variance 20.8x the old one for weights whose outputs have 3.24x the old variance.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from hermes.common.tensors import flatten, load_flat, spec_of
from hermes.common.wire import Payload
from hermes.server.lossprobe import LossProbe, bn_stat_ranges
from hermes.server.metrics import ServerMetrics
from hermes.server.state import ModelState


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))


def _flat_payload(t: torch.Tensor) -> Payload:
    return Payload(dtype=torch.float32, chunks=(t,), shapes=((t.numel(),),))


def _probe(recalibrate: bool) -> tuple[LossProbe, ModelState, nn.Module, torch.Tensor, torch.Tensor]:
    model = _model()
    spec = spec_of(model, "bn-mlp")
    state = ModelState(spec, flatten(model))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(64, 4, generator=g) * 3 + 1, torch.randint(0, 3, (64,), generator=g)
    validation = torch.utils.data.TensorDataset(x, y)
    task = SimpleNamespace(model=_model, loss=F.cross_entropy, transform=None)
    probe = LossProbe(task, spec, state, validation, samples=64, seed=0,  # type: ignore[arg-type]
                      metrics=ServerMetrics(), recalibrate=recalibrate)
    return probe, state, model, x, y


def _scale_first_layer(model: nn.Module, flat: torch.Tensor, factor: float) -> torch.Tensor:
    """The delta that multiplies the first layer's weight and bias by ``factor`` and its variance by factor^2."""
    other = _model()
    load_flat(other, flat)
    with torch.no_grad():
        other[0].weight.mul_(factor)
        other[0].bias.mul_(factor)
        other[1].running_mean.mul_(factor)
        other[1].running_var.mul_(factor**2)
    return flatten(other) - flat


def test_stat_ranges_are_the_batchnorm_running_statistics():
    model = _model()
    ranges = bn_stat_ranges(spec_of(model, "bn-mlp"))
    # float state: 0.weight 32, 0.bias 8, 1.weight 8, 1.bias 8, 1.running_mean 8, 1.running_var 8, 3.weight 24, 3.bias 3
    assert ranges == [(56, 64), (64, 72)]
    assert _probe(recalibrate=False)[0].recalibrates is False  # fold: nothing measured
    assert _probe(recalibrate=False)[0].recalibration([]) is None


def test_recalibration_sets_the_probe_samples_statistics_and_touches_nothing_else():
    probe, state, model, x, y = _probe(recalibrate=True)
    _, w = state.snapshot()
    delta = _scale_first_layer(model, w, 10.0)
    terms = [(_flat_payload(delta), 0.2)]
    step, loss = probe.recalibration(terms)
    state.apply([*terms, (step, 1.0)])
    _, after = state.snapshot()
    # Only the statistics entries moved beyond the share of the delta.
    expected = w + 0.2 * delta
    stats = torch.zeros(w.numel(), dtype=torch.bool)
    for lo, hi in bn_stat_ranges(state.spec):
        stats[lo:hi] = True
    assert torch.allclose(after[~stats], expected[~stats], rtol=0, atol=1e-6)
    # The statistics are those of the folded weights on the probe's samples (momentum None: the batch's own).
    folded = _model()
    load_flat(folded, after)
    h = folded[0](x)
    assert torch.allclose(folded[1].running_mean, h.mean(0), rtol=1e-5, atol=1e-5)
    assert torch.allclose(folded[1].running_var, h.var(0, unbiased=True), rtol=1e-4, atol=1e-5)
    # Eq. of the weights only: first layer scaled by 1 + 0.2 * 9 = 2.8, so the variance by 7.84, not 0.8 + 20.
    old = _model()
    load_flat(old, w)
    ratio = folded[1].running_var / old[0](x).var(0, unbiased=True)
    assert torch.allclose(ratio, torch.full_like(ratio, 2.8**2), rtol=1e-4)
    # The loss it returns is the new model's, scored with those statistics (eval mode; the running variance
    # is the unbiased one, n / (n - 1) = 64 / 63 of what the batch normalised by).
    folded.eval()
    with torch.no_grad():
        assert loss == pytest.approx(float(F.cross_entropy(folded(x), y)), rel=1e-3)
    probe.set_global(state.version, loss)
    assert probe.global_loss() == (state.version, loss)


def test_folded_statistics_are_what_recalibration_repairs():
    # The same fold with statistics added at the share: the variance is 0.8 + 0.2 * 100 = 20.8 times the
    # old, for weights whose outputs have 7.84 times the old variance.
    probe, state, model, x, _ = _probe(recalibrate=False)
    _, w = state.snapshot()
    old = _model()
    load_flat(old, w)
    delta = _scale_first_layer(model, w, 10.0)
    state.apply([(_flat_payload(delta), 0.2)])
    folded = _model()
    load_flat(folded, state.snapshot()[1])
    assert torch.allclose(folded[1].running_var / old[1].running_var, torch.full((8,), 20.8), rtol=1e-4)


def test_a_resume_replays_the_recalibrated_fold_bit_for_bit():
    # The recalibration is one more term of the fold's apply: the journal records it, replay adds it.
    probe, state, model, _, _ = _probe(recalibrate=True)
    _, w = state.snapshot()
    terms = [(_flat_payload(_scale_first_layer(model, w, 3.0)), 0.5)]
    step, _ = probe.recalibration(terms)
    state.apply([*terms, (step, 1.0)])
    replayed = ModelState(state.spec, w)
    replayed.apply([*terms, (step, 1.0)])
    assert torch.equal(replayed.snapshot()[1], state.snapshot()[1])


def test_scoring_with_batch_statistics_ignores_the_candidates_running_statistics():
    probe, state, model, _, _ = _probe(recalibrate=True)
    _, w = state.snapshot()
    broken = torch.zeros_like(w)
    lo, hi = bn_stat_ranges(state.spec)[1]
    broken[lo:hi] = 1e6  # a running variance a million times too large
    assert probe.candidate_loss(_flat_payload(broken), from_current=True) == pytest.approx(
        probe.candidate_loss(_flat_payload(torch.zeros_like(w)), from_current=True))
    folding, *_ = _probe(recalibrate=False)
    assert folding.candidate_loss(_flat_payload(broken), from_current=True) != pytest.approx(
        folding.candidate_loss(_flat_payload(torch.zeros_like(w)), from_current=True))


# ---- through the engine: a push folded by the hermes preset ---------------------------------------------------


def _bn_engine(bn_stats: str):
    import numpy as np

    from hermes.common.clock import ManualClock
    from hermes.common.config import build_config
    from hermes.common.datasets import ArrayDataset
    from hermes.common.task import Task
    from hermes.server.engine import Engine
    from hermes.server.engine.screening import ScreeningSettings
    from hermes.server.events import EventLog

    def split(name: str, n: int, seed: int) -> ArrayDataset:
        rng = np.random.default_rng(seed)
        x = np.ascontiguousarray((rng.standard_normal((n, 4)) * 3 + 1).astype(np.float32))
        return ArrayDataset(name, x, rng.integers(0, 3, n).astype(np.int64), num_classes=3)

    clock = ManualClock()
    config = build_config("hermes", model="mlp", shard_size=16, eval_max_samples=32, **{"loss.bn_stats": bn_stats})
    splits = (split("toy", 128, 0), split("toy-validation", 64, 1), split("toy-test", 32, 2))
    return Engine(config, metrics=ServerMetrics(), events=EventLog(None, clock=clock), max_workers=8,
                  max_message_bytes=1 << 24, splits=splits, clock=clock, screening=ScreeningSettings(enabled=False),
                  task=Task(model=_model, name="toy-bn")), clock


def _push(engine, clock, delta: torch.Tensor) -> dict:
    import asyncio

    from hermes.common.wire import Header, MsgType, decode, encode

    rec, _ = engine.register("a")
    header = Header(type=MsgType.PUSH_UPDATE, worker=rec.id, session="s0", seq=1, ts=int(clock.time() * 1000),
                    model_version=0, body={"samples": 4, "loss": 0.5}, shapes=engine.spec.shapes)
    return decode(asyncio.run(engine.handle(encode(header, delta, key=rec.key)))).header.body


@pytest.mark.parametrize("bn_stats", ["recalibrate", "fold"])
def test_the_engine_measures_a_folds_statistics_under_recalibrate_and_adds_them_under_fold(bn_stats):
    engine, clock = _bn_engine(bn_stats)
    _, w = engine.state.snapshot()
    w = w.clone()
    delta = _scale_first_layer(_model(), w, 10.0)
    assert _push(engine, clock, delta)["status"] == "applied"
    _, after = engine.state.snapshot()
    folded = _model()
    load_flat(folded, after)
    probe = engine.policies.aggregation.probe
    h = folded[0](probe.x)
    measured = torch.allclose(folded[1].running_var, h.var(0, unbiased=True), rtol=1e-4, atol=1e-5)
    if bn_stats == "recalibrate":
        assert measured and probe.global_loss()[0] == engine.state.version  # the fold's loss, cached
        assert torch.allclose(folded[1].running_mean, h.mean(0), rtol=1e-5, atol=1e-5)
    else:
        # The first push is folded at weight 1: the statistics are w's plus the delta's, 100x the old variance.
        assert not measured
        assert torch.allclose(after, w + delta)
