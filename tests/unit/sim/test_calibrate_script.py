"""benchmarks/sim_calibrate_cost.py: the fit recovers known costs, the real engine is measured, tables read runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

import sim_calibrate_cost as cal  # noqa: E402


def test_fit_recovers_known_linear_costs():
    truth = {"a": 2e-4, "b": 3e-9, "c": 1e-6}
    rows = []
    for params in (10_000, 100_000, 1_000_000):
        for workers in (4, 64, 1024):
            secs = {}
            for op in cal.OPS:
                terms = cal.TERMS[op]
                secs[op] = (truth["a"] + (truth["b"] * params if "b" in terms else 0.0)
                            + (truth["c"] * workers if "c" in terms else 0.0))
            rows.append({"params": params, "workers": workers, "seconds": secs})
    fit = cal.fit(rows)
    for op in cal.OPS:
        terms = cal.TERMS[op]
        assert fit[op]["a"] == pytest.approx(truth["a"], rel=1e-6)
        assert fit[op]["b_per_param"] == pytest.approx(truth["b"] if "b" in terms else 0.0, rel=1e-6)
        assert fit[op]["c_per_worker"] == pytest.approx(truth["c"] if "c" in terms else 0.0, rel=1e-6)


def test_measure_drives_the_real_engine_for_every_op():
    secs = cal.measure(10_000, workers=2, repeats=2)
    assert set(cal.OPS) <= set(secs)
    assert secs["push_total"] >= secs["push"] >= 0.0
    assert all(secs[op] >= 0.0 for op in cal.OPS)


def _summary(reached: bool, seconds: float, messages: int, slowdowns=(1.0, 8.0)) -> dict:
    return {"reached_target": reached, "seconds_to_target": seconds if reached else None,
            "messages_total": messages, "final_accuracy": 0.9, "dataset": "digits", "model": "mlp",
            "config": {"model_kwargs": {}}, "links": {"link": "lan"},
            "workers": [{"slowdown": s, "samples": 1000, "compute_seconds": 1.0 * s} for s in slowdowns]}


def test_testbed_table_and_device_flops_read_bench_runs(tmp_path, capsys):
    for link_dir, preset, rep, summ in (("hl8", "bsp", "r0", _summary(True, 10.0, 700)),
                                        ("hl8", "bsp", "r1", _summary(True, 14.0, 720)),
                                        ("hl8@lte", "asp", "r0", _summary(False, 0.0, 2000))):
        d = tmp_path / "runs" / link_dir / preset / rep
        d.mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps(summ))
    assert cal.main(["testbed-table", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| lan | bsp | 2/2 | 12.0 [10.0-14.0] | 710 [700-720] |" in out
    assert "| lte | asp | 0/1 | - |" in out
    assert cal.main(["device-flops", str(tmp_path), "--out", str(tmp_path / "f.json")]) == 0
    got = json.loads((tmp_path / "f.json").read_text())
    # 1,000 samples in 1 s unslowed; slowed 8x: 1,000 * 8 / 8 s = the same thread rate.
    assert got["median_flops"] == pytest.approx(1000 * got["train_flops_per_sample"])
    assert got["thread_cpu_flops"] == pytest.approx(1000 * got["train_flops_per_sample"])


def test_an_empty_bench_folder_is_one_line_and_exit_2(tmp_path, capsys):
    assert cal.main(["testbed-table", str(tmp_path)]) == 2
    assert cal.main(["device-flops", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all("no" in line for line in err)
