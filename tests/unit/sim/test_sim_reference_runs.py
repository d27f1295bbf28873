"""Simulation(alone=True) and the loss aggregation's scoring charged per push, on small runs (digits, MLP)."""

from __future__ import annotations

import pytest

from hermes.common.config import build_config
from hermes.sim.links import transfer_seconds
from hermes.sim.populations import build_population
from hermes.sim.run import Simulation
from hermes.sim.server_cost import PROBE_FLOPS, PROBE_PASSES, CalibratedCost, ZeroCost


def _sim(tmp_path, name, preset="bsp", cost=None, **kw):
    config = build_config(preset, dataset="digits", model="mlp", seed=0, target_accuracy=0.8, max_seconds=60)
    return Simulation(config, build_population("hl8", 4, seed=0, link="lte"), out=tmp_path / name,
                      transfer=transfer_seconds, cost=cost, population="hl8", **kw)


def test_alone_runs_the_fastest_device_with_all_the_data_and_no_link(tmp_path):
    sim = _sim(tmp_path, "alone", alone=True)
    assert [d.name for d in sim.devices] == ["worker-4"] and sim.devices[0].rtt_s == 0.0
    summary = sim.run()
    assert summary["devices"] == 1 and len(summary["workers"]) == 1 and summary["reached_target"]


@pytest.mark.parametrize("preset,cost,charged", [("hermes", CalibratedCost(), True), ("asp", CalibratedCost(), False),
                                                 ("hermes", ZeroCost(), False)])
def test_a_push_pays_for_the_loss_aggregations_scoring(tmp_path, preset, cost, charged):
    sim = _sim(tmp_path, preset, preset=preset, cost=cost)
    expected = PROBE_PASSES * sim.config.loss.eval_samples * sim.eval_flops / PROBE_FLOPS if charged else 0.0
    assert sim.driver.push_extra_seconds == pytest.approx(expected)
    assert (sim.driver.push_extra_seconds > 0) is charged


def test_compute_jitter_varies_the_cycles_and_stays_deterministic(tmp_path):
    from hermes.sim.run import SimError, deterministic_view

    a, b = _sim(tmp_path, "j1", jitter=0.3).run(), _sim(tmp_path, "j2", jitter=0.3).run()
    assert deterministic_view(a) == deterministic_view(b) and a["compute_jitter"] == 0.3
    w = a["workers"][0]
    i = w["cycle_log_fields"].index("compute_seconds")
    assert len({round(r[i], 9) for r in w["cycle_log"]}) > 1  # without jitter a device's equal cycles take equal time
    with pytest.raises(SimError, match="jitter"):
        _sim(tmp_path, "bad", jitter=-1.0)
