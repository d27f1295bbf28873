"""benchmarks/sim_host_calibration.py: a cell pools its runs kept in an earlier table with new ones."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

import sim_host_calibration as hc  # noqa: E402


def test_earlier_runs_join_only_the_cells_named_and_set_the_cells_background(tmp_path):
    rows = [{"link": "lte", "preset": "asp", "testbed_runs": [
                {"seed": 0, "train_s": 210.0, "messages": 2182, "share": 0.1, "background": 16.0},
                {"seed": 1, "train_s": 180.0, "messages": 1980, "share": 0.13, "background": 12.8}]},
            {"link": "lte", "preset": "bsp", "testbed_runs": [{"seed": 0, "train_s": 57.0, "messages": 700,
                                                               "share": 0.3, "background": 3.0}]}]
    path = tmp_path / "table.json"
    path.write_text(json.dumps(rows))
    cells = hc.all_testbed_runs(argparse.Namespace(testbed=[], earlier=f"{path}:lte/asp"))
    assert list(cells) == [("lte", "asp")]
    assert [r["seed"] for r in cells[("lte", "asp")]] == [0, 1]
    assert all(r["earlier"] == str(path) for r in cells[("lte", "asp")])
    # A third run at a lower load: the cell's background is the median of the three.
    cells[("lte", "asp")].append({"seed": 2, "background": 2.0})
    assert hc.cell_background(cells[("lte", "asp")]) == pytest.approx(12.8)


def test_the_background_a_core_share_implies_inverts_processor_sharing():
    # 2 cores, the unslowed agent alone computing with B others: r = 2 / (1 + B) -> B = 2 / r - 1.
    assert hc.background(0.5, [1.0]) == pytest.approx(3.0)
    # A slowed agent computes 1 / (1 + (s - 1) r) of its time: one more part-time competitor.
    assert hc.background(0.5, [1.0, 3.0]) == pytest.approx(3.0 - 0.5)


def test_the_median_of_three_counts_a_miss_as_slower_than_every_run_that_reached():
    assert hc.median_with_misses([46.7, 95.4], 3) == pytest.approx(95.4)
    assert hc.median_with_misses([96.4], 3) is None
    assert hc.median_with_misses([30.0, 10.0, 20.0], 3) == pytest.approx(20.0)


def test_seed_background_runs_each_seed_at_its_own_testbed_runs_background(tmp_path, monkeypatch, capsys):
    rows = [{"link": "lan", "preset": "hermes-paper", "testbed_runs": [
        {"seed": 0, "background": 6.66}, {"seed": 1, "background": 4.05}, {"seed": 3, "background": 2.53}]}]
    path = tmp_path / "table.json"
    path.write_text(json.dumps(rows))
    cmds: list[list[str]] = []
    monkeypatch.setattr(hc.subprocess, "run", lambda cmd, check: cmds.append(cmd))

    def hosts(*extra: str) -> list[str]:
        cmds.clear()
        assert hc.main(["sim", "--earlier", f"{path}:lan/hermes-paper", "--cells", "lan/hermes-paper", "--seeds",
                        "0,1,2", "--host-extra", ",sleeper=auto", "--out", str(tmp_path / "out"), *extra]) == 0
        return [c[c.index("--host") + 1] for c in cmds]

    # Without the flag every seed runs at the cell's median background (of 6.66, 4.05 and 2.53).
    assert hosts() == ["testbed:background=4.05,sleeper=auto"] * 3
    # With it, each seed at its own run's; a seed the testbed has no run of is one line on stderr, not run.
    assert hosts("--seed-background") == ["testbed:background=6.66,sleeper=auto", "testbed:background=4.05,sleeper=auto"]
    assert "lan/hermes-paper seed 2: no testbed run of that seed" in capsys.readouterr().err


def test_a_cycle_s_compute_seconds_are_the_agent_s_own_where_the_claims_floor_raised_them(tmp_path):
    # The "lte stall" (docs/simulation.md, 2026-11-28): the server's claims floor raised every fp32 bsp and fedbuff cycle on lte to
    # a quarter of its window, the push's transfer included, and the step tables read the raise as the agents'
    # steps (12x the S = 1 agent's least cost). Before the cycle event kept the claim, its claim_clamped did.
    events = tmp_path / "events.jsonl"
    records = [
        {"event": "join", "worker": "w1", "slowdown": 1.0},
        {"event": "join", "worker": "w2", "slowdown": 4.0},
        {"event": "claim_clamped", "worker": "w1", "field": "compute_seconds", "claimed": 0.01, "bound": 0.1},
        {"event": "claim_clamped", "worker": "w1", "field": "compute_seconds", "claimed": 0.1, "bound": 0.12},
        {"event": "claim_clamped", "worker": "w2", "field": "samples", "claimed": 999, "bound": 128},
        {"event": "cycle", "worker": "w1", "dss": 128, "batch_size": 32, "compute_seconds": 0.12},  # an old run's
        {"event": "cycle", "worker": "w2", "dss": 128, "batch_size": 32, "compute_seconds": 0.04},  # not raised
        {"event": "cycle", "worker": "w1", "dss": 128, "batch_size": 32, "compute_seconds": 0.1,
         "claimed_compute_seconds": 0.02},  # since 2026-11-28
        {"event": "cycle", "worker": "w1", "dss": 128, "batch_size": 32, "compute_seconds": 0.03},
    ]
    events.write_text("".join(json.dumps(r) + "\n" for r in records))
    slow, cycles = hc.joins_and_cycles(events)
    assert slow == {"w1": 1.0, "w2": 4.0}
    assert [(c["worker"], c["own_compute_seconds"]) for c in cycles] == [
        ("w1", 0.01), ("w2", 0.04), ("w1", 0.02), ("w1", 0.03)]
    # The unslowed agent's rate is its samples over its own seconds, not over the raised ones.
    assert hc.fast_flops(events) == pytest.approx(
        3 * 128 * hc.TRAIN_FLOPS * hc.Host(hc.HostSpec()).cycle_factor(128, 4) / 0.06)
    # The CPU share takes the summary's totals, which are the agents' own reports (the server's registry keeps their
    # stats, not the floor's raise): raised cycles in the events leave it alone.
    summary = {"workers": [{"id": "w1", "samples": 384, "slowdown": 1.0, "compute_seconds": 0.06}]}
    assert hc.share(summary, events) == pytest.approx(384 * hc.TRAIN_FLOPS / hc.THREAD_FLOPS / 0.06)


def _bench_folder(path: Path, mode: str, ms: float | None, pace: float, link: str = "lte") -> str:
    suite = {"slowdown_mode": mode, "pace": pace, **({"nominal_sample_ms": ms} if ms is not None else {})}
    path.mkdir(parents=True)
    (path / "results.json").write_text(json.dumps({"suite": suite, "runs": [
        {"status": "ok", "link": link, "preset": "hermes-paper"}]}))
    return str(path)


def test_a_cells_nominal_settings_come_from_its_testbed_folders_and_must_agree(tmp_path):
    a = _bench_folder(tmp_path / "a", "nominal", 0.0516, 3.0)
    b = _bench_folder(tmp_path / "b", "nominal", 0.0516, 3.0)
    assert hc.nominal_settings([a, b], "lte", "hermes-paper") == (0.0516, 3.0)
    # A folder without that cell's runs does not count; a cell under another rule has none.
    other = _bench_folder(tmp_path / "c", "nominal", 0.07, 2.0, link="lan")
    assert hc.nominal_settings([a, other], "lte", "hermes-paper") == (0.0516, 3.0)
    assert hc.nominal_settings([_bench_folder(tmp_path / "d", "floor", None, 1.0)], "lte", "hermes-paper") is None
    with pytest.raises(SystemExit, match="different nominal costs or paces"):
        hc.nominal_settings([a, _bench_folder(tmp_path / "e", "nominal", 0.0516, 2.0)], "lte", "hermes-paper")


def test_sim_nominal_runs_each_seed_at_the_testbeds_nominal_pace_and_the_nominals_thread_rate(tmp_path, monkeypatch):
    folder = _bench_folder(tmp_path / "tb", "nominal", 0.05, 3.0)
    commands: list[list[str]] = []
    monkeypatch.setattr(hc.subprocess, "run", lambda cmd, check: commands.append(cmd))
    monkeypatch.setattr(hc, "testbed_runs", lambda dirs: {})
    hc.main(["sim", "--testbed", folder, "--out", str(tmp_path / "sim"), "--cells", "lte/hermes-paper", "--seeds", "0,1",
             "--background", "0", "--jitter", "0", "--nominal"])
    hosts = [cmd[cmd.index("--host") + 1] for cmd in commands]
    assert hosts == [f"testbed:background=0.0,nominal=0.05,pace=3,thread_flops={hc.TRAIN_FLOPS / 0.00005:.6g}"] * 2
    # The settings given by hand (a cell whose testbed runs are not in yet), and the host's own thread rate.
    commands.clear()
    hc.main(["sim", "--out", str(tmp_path / "sim2"), "--cells", "lan/bsp", "--seeds", "0", "--background", "0",
             "--nominal", "--nominal-settings", "0.06,2", "--no-nominal-thread"])
    assert commands[0][commands[0].index("--host") + 1] == "testbed:background=0.0,nominal=0.06,pace=2"


def test_sim_trains_in_the_precision_the_cells_testbed_agents_chose_or_the_one_given(tmp_path, monkeypatch, capsys):
    commands: list[list[str]] = []
    monkeypatch.setattr(hc.subprocess, "run", lambda cmd, check: commands.append(cmd))
    runs = {("lte", "hermes"): [{"seed": 0, "background": None, "precisions": ["bf16"]},
                                {"seed": 1, "background": None, "precisions": ["bf16"]}],
            ("lan", "hermes"): [{"seed": 0, "background": None, "precisions": ["bf16"]},
                                {"seed": 1, "background": None, "precisions": ["fp32"]}]}
    monkeypatch.setattr(hc, "testbed_runs", lambda dirs: runs)
    base = ["sim", "--testbed", "tb", "--seeds", "0", "--background", "0", "--jitter", "0"]

    def precisions(cmds: list[list[str]]) -> list[str | None]:
        return [next((c[i + 1] for i, x in enumerate(c) if x == "--set" and c[i + 1].startswith("precision=")), None)
                for c in cmds]

    hc.main([*base, "--out", str(tmp_path / "a"), "--cells", "lte/hermes", "--precision", "testbed"])
    assert precisions(commands) == ["precision=bf16"]
    # Agents that chose differently: no sim, and the reason.
    commands.clear()
    hc.main([*base, "--out", str(tmp_path / "b"), "--cells", "lan/hermes", "--precision", "testbed"])
    assert commands == [] and "trained in ['bf16', 'fp32']; give --precision" in capsys.readouterr().err
    # Given, or the simulator's own (no --set).
    hc.main([*base, "--out", str(tmp_path / "c"), "--cells", "lan/hermes", "--precision", "fp32"])
    hc.main([*base, "--out", str(tmp_path / "d"), "--cells", "lan/hermes"])
    assert precisions(commands) == ["precision=fp32", None]
    # The device link's model goes to every run as given; none given, the simulator's own.
    hc.main([*base, "--out", str(tmp_path / "e"), "--cells", "lan/hermes", "--device-link", "queue:0.65"])
    assert commands[-1][commands[-1].index("--device-link") + 1] == "queue:0.65"
    assert all("--device-link" not in c for c in commands[:-1])
