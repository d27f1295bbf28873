"""The testbed with emulated links: agents train behind them and every byte they move crosses them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hermes.deploy.netlab import kernel_available, stale_namespaces
from tests.conftest import run_testbed

pytestmark = pytest.mark.integration


def _check_links(s: dict, mode: str, names: list[str]) -> None:
    assert s["reached_target"] is True
    links = s["links"]
    assert links["mode"] == mode
    assert [links["agents"][f"worker-{i + 1}"]["name"] for i in range(len(names))] == names
    for w in s["workers"]:
        relayed = links["agents"][w["name"]]["relayed_bytes"]
        if links["agents"][w["name"]]["name"] == "lan":
            assert relayed is None
            continue
        # Everything the agent counted itself went through its link, framing and HTTP on top.
        up, down = relayed
        assert up >= w["bytes_sent"] > 0 and down >= w["bytes_received"] > 0, (w["name"], relayed)


@pytest.mark.skipif(not kernel_available(), reason="kernel links need root and iproute2")
def test_kernel_links(tmp_path: Path) -> None:
    _, s = run_testbed(tmp_path / "run", "--clients", "2", "--profile", "hl2", "--preset", "asp",
                       "--links", "lte,wifi", "--target-accuracy", "0.85")
    _check_links(s, "kernel", ["lte", "wifi"])
    # The run removed its namespaces (hlkPID-i, PID its testbed's, which has exited). Another test's testbed may
    # hold namespaces meanwhile (xdist runs tests side by side): those of a live process are not this run's.
    assert stale_namespaces() == []


@pytest.mark.slow  # the default suite keeps one run per family under 15 min (2026-11-26); tests/integration/test_links.py measures the process relay
def test_process_links(tmp_path: Path) -> None:
    _, s = run_testbed(tmp_path / "run", "--clients", "2", "--profile", "hl2", "--preset", "asp",
                       "--links", "lan,lte", "--link-mode", "process", "--target-accuracy", "0.85")
    _check_links(s, "process", ["lan", "lte"])


def test_link_typo_is_one_line(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "hermes.deploy.testbed", "--link", "ltee", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "unknown link 'ltee'" in proc.stderr
