"""Transfer times and the server link's FIFO contention arithmetic."""

from __future__ import annotations

import math

import pytest

from hermes.sim.links import ServerLink, serialization_seconds, transfer_seconds


def test_transfer_is_half_the_rtt_plus_serialization():
    # 1.25 MB at 10 Mbit/s: 1 s on the wire; 50 ms RTT: 25 ms each way (the testbed relay's RTT/2).
    assert transfer_seconds(1_250_000, 10.0, 0.05) == pytest.approx(1.025)
    # A request and its reply: one RTT in all.
    assert transfer_seconds(0, 10.0, 0.05) * 2 == pytest.approx(0.05)
    assert transfer_seconds(10**9, math.inf, 0.0) == 0.0


def test_the_lte_profile_moves_a_paper_size_model():
    # 108,618 fp32 parameters = 434,472 bytes; lte: 10 Mbit/s up, 30 down, 50 ms (deploy/links.py).
    nbytes = 108_618 * 4
    assert transfer_seconds(nbytes, 10.0, 0.05) == pytest.approx(0.025 + nbytes * 8 / 10e6)
    assert transfer_seconds(nbytes, 30.0, 0.05) == pytest.approx(0.025 + nbytes * 8 / 30e6)


@pytest.mark.parametrize("args", [(-1, 10.0, 0.0), (1, 0.0, 0.0), (1, -5.0, 0.0), (1, 10.0, -0.1)])
def test_bad_transfer_arguments_are_refused(args):
    with pytest.raises(ValueError):
        transfer_seconds(*args)


def test_server_link_queues_fifo_per_direction():
    link = ServerLink(up_mbps=8.0, down_mbps=80.0)  # 1 MB/s up, 10 MB/s down
    # Three devices push 1 MB each at t=0, 0.5 and 5: the second waits for the first.
    assert link.reserve(0.0, 1_000_000, "up") == pytest.approx(1.0)
    assert link.reserve(0.5, 1_000_000, "up") == pytest.approx(2.0)
    assert link.reserve(5.0, 1_000_000, "up") == pytest.approx(6.0)
    # The down direction is independent (full duplex).
    assert link.reserve(0.5, 1_000_000, "down") == pytest.approx(0.6)
    stats = link.stats()
    assert stats["bytes_up"] == 3_000_000 and stats["busy_s_up"] == pytest.approx(3.0)
    assert stats["queued_s_up"] == pytest.approx(0.5) and stats["queued_s_down"] == 0.0


def test_n_simultaneous_pushes_finish_n_serializations_apart():
    n, nbytes = 1000, 434_472
    link = ServerLink(up_mbps=1000.0, down_mbps=1000.0)
    finishes = [link.reserve(10.0, nbytes, "up") for _ in range(n)]
    each = nbytes * 8 / 1e9
    assert finishes[-1] == pytest.approx(10.0 + n * each)
    assert all(b - a == pytest.approx(each) for a, b in zip(finishes, finishes[1:], strict=False))


def test_an_unshaped_server_link_never_queues():
    link = ServerLink(math.inf, math.inf)
    assert [link.reserve(3.0, 10**9, "down") for _ in range(3)] == [3.0, 3.0, 3.0]


def test_bad_server_link_arguments_are_refused():
    with pytest.raises(ValueError):
        ServerLink(0.0, 10.0)
    with pytest.raises(ValueError):
        ServerLink(10.0, 10.0).reserve(0.0, 1, "sideways")  # type: ignore[arg-type]
    assert serialization_seconds(0, 1.0) == 0.0
