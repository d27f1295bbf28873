"""hermes-bench with engine = "sim": a small suite through the real CLI, every variant simulated by hermes-sim,
the DDP-like BSP, the ideal cluster and the fastest device alone among them, and the bench's tables written."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# A wait, not a timing assertion: five runs of a few virtual seconds each, on a loaded 2-core machine.
HANG_S = 600

SUITE = """
name = "sim-tiny"
engine = "sim"
profiles = ["hl8"]
repeats = 1
dataset = "digits"
target_accuracy = 0.8
max_seconds = 60.0
variants = [
  { label = "bsp", preset = "bsp" },
  { label = "hermes", preset = "hermes" },
  { label = "ddp", preset = "bsp", runner = "ddp", overrides = { lr = 0.1 } },
  { label = "ideal", preset = "bsp", homogeneous = true },
  { label = "alone", preset = "bsp", runner = "alone" },
]
"""


def test_a_sim_suite_runs_in_simulation_and_writes_the_tables(tmp_path):
    suite = tmp_path / "tiny.toml"
    suite.write_text(SUITE)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "hermes.deploy.bench", "run", str(suite), "--out", str(out)],
                          capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    results = json.loads((out / "results.json").read_text())
    runs = {r["variant"]: r for r in results["runs"]}
    assert list(runs) == ["bsp", "hermes", "ddp", "ideal", "alone"]
    for label, r in runs.items():
        assert r["status"] == "ok", r
        s = r["summary"]
        assert s["engine"] == "sim" and (out / r["run_dir"] / "sim.log").is_file(), label
        assert s["reached_target"] and s["seconds_to_target"] <= s["virtual_seconds"], label
        assert s["messages_total"] > 0 and r["events"], label
    flops = {label: [w["flops"] for w in r["summary"]["workers"]] for label, r in runs.items()}
    # hl8's devices at their own speeds; the ideal cluster at their mean; the fastest one alone.
    assert len(set(flops["bsp"])) == 3 and len(set(flops["ideal"])) == 1
    assert sum(flops["ideal"]) == pytest.approx(sum(flops["bsp"]))
    assert flops["alone"] == [max(flops["bsp"])]
    # DDP-like: a barrier every mini-batch, so many more rounds than bsp's 128-sample cycles for the same data.
    assert runs["ddp"]["summary"]["model_updates"] > 2 * runs["bsp"]["summary"]["model_updates"]

    report = (out / "report.md").read_text()
    assert "hermes-sim" in report and "virtual seconds" in report
    for label, r in runs.items():
        row = next(line for line in report.splitlines() if line.startswith(f"| `{label}` |"))
        assert f"| {r['summary']['messages_total']} |" in row, row
    assert "1.00× (baseline)" in report and "1.00× (peer)" in report
    assert len(list(out.glob("*.png"))) >= 3
