"""hermes-bench micro: the in-process comparisons run and report a ratio per row."""

from __future__ import annotations

from benchmarks.micro import (
    bench_codec,
    bench_evaluator,
    ratio_rows,
    render_micro,
)
from hermes.deploy.bench.machine import machine_info


def test_codec_and_evaluator_are_measured_against_bare_baselines():
    codec = bench_codec(3, numel=20_000)
    assert {(r["op"], r["dtype"]) for r in codec} == {("encode", "fp32"), ("decode", "fp32"),
                                                       ("encode", "fp16"), ("decode", "fp16")}
    for r in codec:
        assert r["ms"] > 0 and r["bare_ms"] > 0 and r["ratio"] == r["ms"] / r["bare_ms"]
    ev = bench_evaluator(2)
    assert ev["samples"] == 360 and ev["ratio"] == ev["ms"] / ev["bare_ms"]

    res = {"machine": machine_info(), "codec": codec, "evaluator": ev, "kafka": {"skipped": "--skip-kafka"},
           "seconds": 1.0, "quick": True}
    rows = ratio_rows(res)
    assert len(rows) == len(codec) + 1
    md = render_micro(res)
    assert "| codec encode" in md and "| evaluator" in md and "skipped: --skip-kafka" in md
