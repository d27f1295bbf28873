"""benchmarks/sim_table_1000.py: every cell runs one workload, the table compares against alone, the breakdown adds up."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

import sim_table_1000 as st  # noqa: E402


def _cell(root: Path, name: str, *, reached: bool, to_target: float | None, virtual: float,
          timeline: list[tuple[float, float]], workers: list[dict[str, Any]]) -> None:
    out = root / name
    out.mkdir(parents=True)
    (root / f"{name}.json").write_text(json.dumps({"cell": name, "rc": 0, "load_before": "1.0 1.0 1.0",
                                                   "load_after": "2.0 2.0 2.0", "started_utc": "2026-11-27T23:00:00Z"}))
    (root / f"{name}.time").write_text("\tUser time (seconds): 10.5\n\tSystem time (seconds): 1.5\n"
                                        "\tMaximum resident set size (kbytes): 2048000\n")
    summary = {"reached_target": reached, "seconds_to_target": to_target, "virtual_seconds": virtual,
               "wall_seconds": 100.0, "final_accuracy": timeline[-1][1], "messages_total": 50, "model_updates": 7,
               "accuracy_timeline": [{"elapsed": t, "accuracy": a} for t, a in timeline], "workers": workers,
               "server_busy_seconds": 3.0, "flops_per_sample": {"train": 1e7}, "messages_by_type": {"push": 30}}
    (out / "summary.json").write_text(json.dumps(summary))


def test_every_cell_shares_the_workload_and_differs_only_in_its_system(tmp_path):
    for cell in st.CELLS:
        cmd = st.command(cell, tmp_path / cell, [])
        joined = " ".join(cmd)
        assert " ".join(st.WORKLOAD) in joined
        assert "--charge-model cnn:1x28x28" in joined and "num_samples=200000" in joined
        # Comparable local optimizer quality: the table's systems train alone's tuned local SGD; every other cell
        # (the preset's-own control row, the one-step fast-admission cells tuned for averaged deltas) states both
        # its momentum and its lr, so no cell silently trains with a preset's default.
        if cell in ("alone", "hermes", "fedbuff", "fedasync", "bsp"):
            assert " ".join(st.LOCAL) in joined, cell
        else:
            assert "--set momentum=" in joined and "--set lr=" in joined, cell
    assert "--alone" in st.CELLS["alone"] and not any("--alone" in st.CELLS[c] for c in st.CELLS if c != "alone")


def test_table_compares_each_cell_with_the_device_alone(tmp_path):
    dev = [{"flops": 1e9, "device": {"cycles": 3, "samples": 1536, "compute_seconds": 20.0, "wait_seconds": 1.0}}]
    _cell(tmp_path, "alone", reached=True, to_target=300.0, virtual=300.0,
          timeline=[(5.0, 0.3), (60.0, 0.88), (300.0, 0.98)], workers=dev)
    _cell(tmp_path, "fedbuff", reached=False, to_target=None, virtual=75.0,
          timeline=[(5.0, 0.2), (60.0, 0.41)], workers=dev * 2)
    _cell(tmp_path, "hermes", reached=True, to_target=60.0, virtual=60.0,
          timeline=[(5.0, 0.2), (60.0, 0.981)], workers=dev)
    text = st.table(tmp_path)
    rows = {line.split("|")[1].strip(): line for line in text.splitlines()[2:]}
    assert "not reached in 75 s (alone: 300 s)" in rows["fedbuff"]
    # alone's accuracy at the same virtual second as the cell's last evaluation.
    assert "| 0.41 (60 s) | 0.88 |" in rows["fedbuff"]
    # The cell's best, 0.41, first at 60 s; alone first had it at 60 s too.
    assert "| 0.41 (60 s) | 60 s (1.0x) |" in rows["fedbuff"]
    assert "**5.0x faster**" in rows["hermes"]
    assert "3,072" in rows["fedbuff"] and "2000 MB" in rows["fedbuff"] and "12.0" in rows["fedbuff"]
    assert "not run" in rows["bsp"]
    assert len(rows["bsp"].split("|")) == len(rows["alone"].split("|"))


def test_breakdown_counts_the_devices_compute(tmp_path):
    dev = {"cycles": 2, "samples": 1024, "compute_seconds": 30.0, "wait_seconds": 2.0, "lost_cycles": 1, "offline": 1}
    _cell(tmp_path, "fedbuff", reached=False, to_target=None, virtual=60.0, timeline=[(60.0, 0.4)],
          workers=[{"flops": 1e9, "device": dev}, {"flops": 3e9, "device": dev}])
    text = st.breakdown(tmp_path / "fedbuff")
    assert "cycles 4" in text and "samples 2,048" in text and "cycles lost to churn 2" in text
    # 60 device-seconds of compute over 60 virtual s: one device computing at a time on average.
    assert "on average 1 devices computing at once" in text
    # (1e9 + 3e9) x 30 s over 60 s: 2 GFLOP/s delivered.
    assert "compute delivered 2 GFLOP/s" in text


def test_a_cell_stopped_at_the_wall_limit_reports_its_last_evaluation(tmp_path):
    dev = [{"flops": 1e9, "device": {"cycles": 1, "samples": 128}}]
    _cell(tmp_path, "alone", reached=True, to_target=300.0, virtual=300.0,
          timeline=[(5.0, 0.3), (30.0, 0.7), (300.0, 0.98)], workers=dev)
    out = tmp_path / "hermes"
    out.mkdir()
    (tmp_path / "hermes.json").write_text(json.dumps({"cell": "hermes", "rc": 124, "wall_limit": 480, "load_after": "9"}))
    (out / "events.jsonl").write_text("\n".join(json.dumps(e) for e in (
        {"event": "evaluation", "elapsed": 5.0, "accuracy": 0.1}, {"event": "push", "elapsed": 6.0},
        {"event": "evaluation", "elapsed": 35.0, "accuracy": 0.33})) + "\n")
    row = next(line for line in st.table(tmp_path).splitlines() if line.startswith("| hermes"))
    assert "stopped at the wall limit (rc 124)" in row and "| 0.33 (35 s) | 0.7 |" in row and "| 480 |" in row
    assert "| 0.33 (35 s) | 30 s (1.2x) |" in row
