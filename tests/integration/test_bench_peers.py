"""hermes-bench's peers end to end: torch DDP and the ideal homogeneous cluster in a tiny real suite."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # about 45 s: two real runs


def test_ddp_and_ideal_peers_on_an_lte_link(tmp_path):
    suite = tmp_path / "peers.toml"
    suite.write_text('profiles = ["hl8"]\nlinks = ["lte"]\nclients = 3\nrepeats = 1\nbaseline = "ddp"\n'
                     'target_accuracy = 0.8\nmax_seconds = 30\n'
                     '[[variants]]\nlabel = "ddp"\npreset = "bsp"\nrunner = "ddp"\n'
                     '[[variants]]\nlabel = "ideal"\npreset = "bsp"\nhomogeneous = true\n')
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "hermes.deploy.bench", "run", str(suite), "--out", str(out)],
                          capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    runs = {r["variant"]: r for r in results["runs"]}
    assert [r["key"] for r in results["runs"]] == ["hl8@lte/ddp/r0", "hl8@lte/ideal/r0"]

    ddp = runs["ddp"]["summary"]
    assert ddp["preset"] == "ddp" and ddp["reached_target"] is True and ddp["clients"] == 3
    assert ddp["train_seconds_to_target"] > 0 and ddp["accuracy_timeline"][-1]["accuracy"] >= 0.8
    # bsp's optimizer at its operating point: lr linear in the global batch from there.
    assert ddp["ddp"]["lr"] > 0 and ddp["ddp"]["global_batch"] == 3 * ddp["ddp"]["batch_per_rank"]
    assert ddp["links"]["mode"] == "modelled" and ddp["links"]["agents"]["rank-0"]["name"] == "lte"
    # Each rank's slowdown is its HL8 agent's: the first three of (6, 6, 4, 32) cores -> speeds 1, 1, 2/3.
    assert [round(w["speed"], 4) for w in ddp["workers"]] == [1.0, 1.0, 0.6667]
    assert [round(w["slowdown"], 4) for w in ddp["workers"]] == [1.0, 1.0, 1.5]
    assert all(w["messages"] > 0 and w["bytes_sent"] > 0 for w in ddp["workers"])

    ideal = runs["ideal"]["summary"]
    # The homogeneous cluster of the same total compute: hl1, every agent at the mean HL8 speed.
    assert ideal["profile"] == "hl1" and ideal["pace"] == pytest.approx(3 / (1 + 1 + 2 / 3), rel=1e-4)
    assert ideal["reached_target"] is True
    assert ideal["links"]["mode"] in ("kernel", "process")
    assert {a["name"] for a in ideal["links"]["agents"].values()} == {"lte"}

    # On lan too the all-reduces are counted (the hook that models links also counts).
    lan = subprocess.run([sys.executable, "-m", "hermes.deploy.testbed", "--peer", "ddp", "--clients", "2",
                          "--profile", "hl8", "--max-seconds", "3", "--out", str(tmp_path / "lan")],
                         capture_output=True, text=True, timeout=200)
    assert lan.returncode == 0, lan.stderr[-3000:]
    s = json.loads((tmp_path / "lan" / "summary.json").read_text())
    assert s["links"]["mode"] == "none" and s["messages_total"] >= s["model_updates"] * 2 > 0

    report = (out / "report.md").read_text()
    assert "## HL8@LTE" in report and "Links emulated" in report and "`ideal`" in report
