"""The DDP peer's communication hooks end to end (hermes-testbed --peer ddp --ddp-hook): fp16 and PowerSGD train,
say which hook ran, and charge the link fewer bytes per all-reduce than the plain all-reduce."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # three short real DDP runs


def _run(tmp_path: Path, hook: str) -> dict:
    out = tmp_path / hook
    proc = subprocess.run([sys.executable, "-m", "hermes.deploy.testbed", "--peer", "ddp", "--clients", "2",
                           "--profile", "hl8", "--link", "lte", "--max-seconds", "4", "--ddp-hook", hook,
                           "--ddp-powersgd-rank", "2", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((out / "summary.json").read_text())


def test_fp16_and_powersgd_hooks_send_fewer_bytes_per_allreduce(tmp_path: Path) -> None:
    per = {}
    for hook in ("allreduce", "fp16", "powersgd"):
        s = _run(tmp_path, hook)
        assert s["ddp"]["comm_hook"] == hook and s["model_updates"] > 0
        per[hook] = s["bytes_sent_total"] / s["messages_total"]
    assert per["fp16"] == pytest.approx(per["allreduce"] / 2, rel=0.01)
    # The first step all-reduces whole (start_powerSGD_iter 2), then P and Q only.
    assert per["powersgd"] < per["fp16"]


def test_the_alone_baseline_is_one_rank_without_a_link(tmp_path: Path) -> None:
    suite = tmp_path / "alone.toml"
    suite.write_text('profiles = ["hl8"]\nlinks = ["lte"]\nclients = 2\nrepeats = 1\nbaseline = "alone"\n'
                     'target_accuracy = 0.8\nmax_seconds = 20\n'
                     '[[variants]]\nlabel = "alone"\npreset = "bsp"\nrunner = "alone"\n')
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "hermes.deploy.bench", "run", str(suite), "--out", str(out)],
                          capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = json.loads((out / "results.json").read_text())["runs"][0]
    s = run["summary"]
    assert run["key"] == "hl8@lte/alone/r0" and s["clients"] == 1 and s["profile"] == "hl1"
    assert s["links"]["mode"] == "none" and s["reached_target"] is True
    assert [w["slowdown"] for w in s["workers"]] == [1.0]  # HL8's fastest device
