"""The server cost model: deterministic linear figures, the measured mode, and the constants' provenance."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hermes.sim.server_cost import (
    CALIBRATION,
    OPS,
    CalibratedCost,
    Coefficients,
    MeasuredCost,
    ServerCost,
    UnknownOperation,
    calibrated,
    measured,
)

CALIBRATION_FILE = Path(__file__).resolve().parents[3] / "docs" / "bench" / "sim-calibration" / "server-cost.json"


def test_calibrated_is_linear_in_params_and_workers():
    model = CalibratedCost({op: Coefficients(1e-3, 2e-9, 5e-6) for op in OPS})
    assert model.seconds("fold", params=0, workers=0) == pytest.approx(1e-3)
    assert model.seconds("fold", params=1_000_000, workers=100) == pytest.approx(1e-3 + 2e-3 + 5e-4)
    half = CalibratedCost({op: Coefficients(1e-3, 2e-9, 5e-6) for op in OPS}, eval_samples=1000, speed=2.0)
    assert half.seconds("evaluate", params=0, workers=0) == pytest.approx(1e-3 / 2 / 2)
    assert half.seconds("pull", params=0, workers=0) == pytest.approx(1e-3 / 2)


def test_calibrated_is_deterministic_and_positive_for_every_op():
    a, b = calibrated(), calibrated()
    for op in OPS:
        for params, workers in ((10_000, 4), (108_618, 1000), (4_000_000, 100_000)):
            s = a.seconds(op, params=params, workers=workers)
            assert s == b.seconds(op, params=params, workers=workers) and s > 0


def test_bigger_models_cost_more_where_the_engine_touches_every_parameter():
    cost = calibrated()
    for op in ("pull", "push", "fold", "evaluate"):
        assert cost.seconds(op, params=4_000_000, workers=4) > cost.seconds(op, params=10_000, workers=4)


def test_unknown_ops_and_negative_sizes_are_refused():
    with pytest.raises(UnknownOperation, match="'gossip'"):
        calibrated().seconds("gossip", params=1, workers=1)
    with pytest.raises(ValueError):
        calibrated().seconds("pull", params=-1, workers=1)
    with pytest.raises(ValueError, match="lacks"):
        CalibratedCost({"pull": Coefficients(0, 0, 0)})


def test_measured_returns_the_timed_cpu_seconds_once_then_falls_back():
    cost = measured()
    assert isinstance(cost, MeasuredCost) and isinstance(cost, ServerCost)
    cost.record("push", 0.25)
    assert cost.seconds("push", params=10, workers=1) == 0.25
    fallback = cost.seconds("push", params=10, workers=1)
    assert fallback == calibrated().seconds("push", params=10, workers=1) and cost.fallbacks == 1
    with cost.timed("fold"):
        sum(range(10_000))
    assert cost.seconds("fold", params=10, workers=1) >= 0.0 and cost.fallbacks == 1


def test_the_constants_are_the_calibration_files_fit():
    fit = json.loads(CALIBRATION_FILE.read_text())["fit"]
    for op in OPS:
        k = CALIBRATION[op]
        assert (k.a, k.b_per_param, k.c_per_worker) == pytest.approx(
            (fit[op]["a"], fit[op]["b_per_param"], fit[op]["c_per_worker"]), rel=1e-3, abs=1e-12), op


def test_the_loss_aggregations_scoring_is_charged_per_push():
    from hermes.sim.server_cost import PROBE_FLOPS, PROBE_PASSES, CalibratedCost, ZeroCost, probe_seconds

    # Two forward passes (candidate and global model) of loss.eval_samples at PROBE_FLOPS: the paper's CNN on
    # 512 samples (163.8 MFLOP a pass, benchmarks/sim_probe_cost.py) is about 11 ms of server CPU a push.
    fwd = 163.8e6 / 512
    s = probe_seconds(CalibratedCost(), scores=True, samples=512, forward_flops=fwd)
    assert s == pytest.approx(PROBE_PASSES * 163.8e6 / PROBE_FLOPS) and 0.009 < s < 0.013
    assert probe_seconds(CalibratedCost(speed=2.0), scores=True, samples=512, forward_flops=fwd) == pytest.approx(s / 2)
    assert probe_seconds(CalibratedCost(), scores=False, samples=512, forward_flops=fwd) == 0.0  # asp, bsp...
    assert probe_seconds(ZeroCost(), scores=True, samples=512, forward_flops=fwd) == 0.0
