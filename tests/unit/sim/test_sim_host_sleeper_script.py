"""benchmarks/sim_host_sleeper.py: the credit a burst's wall time implies (HostSpec.sleeper = "auto")."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

import sim_host_sleeper as hs  # noqa: E402


def test_the_credit_inverts_a_burst_at_a_full_core_then_at_the_busy_share():
    # 5 ms of CPU, 2 ms of it at a full core and 3 ms at a quarter of one: 2 + 12 = 14 ms of wall.
    assert hs.credit(0.005, 0.014, 0.25) == pytest.approx(0.002)
    # At the busy share throughout (20 ms): no credit; at a full core throughout (5 ms): all of it.
    assert hs.credit(0.005, 0.020, 0.25) == pytest.approx(0.0)
    assert hs.credit(0.005, 0.005, 0.25) == pytest.approx(0.005)
    # Noise past either end is clipped to the burst: never negative, never more than its CPU.
    assert hs.credit(0.005, 0.030, 0.25) == 0.0
    assert hs.credit(0.005, 0.004, 0.25) == 0.005
    # A core free for the busy thread too: nothing to preempt, no credit to read.
    assert hs.credit(0.005, 0.005, 0.97) is None
