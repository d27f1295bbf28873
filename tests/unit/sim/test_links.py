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


def test_framed_transfers_carry_each_tcp_segments_headers():
    from hermes.sim.links import HEADER_BYTES, MSS, framed_transfer_seconds, wire_bytes

    assert wire_bytes(0) == 0
    assert wire_bytes(1) == 1 + HEADER_BYTES and wire_bytes(MSS) == MSS + HEADER_BYTES
    assert wire_bytes(MSS + 1) == MSS + 1 + 2 * HEADER_BYTES
    # The testbed's lte exchange: a 434,700-byte push up at 10 Mbit/s and the model back at 30, one 50 ms RTT:
    # 0.514 s for the bytes alone, 0.535 s with 301 segments' headers each way (agents logged 0.536-0.548 s).
    alone = transfer_seconds(434_700, 10.0, 0.05) + transfer_seconds(434_700, 30.0, 0.05)
    framed = framed_transfer_seconds(434_700, 10.0, 0.05) + framed_transfer_seconds(434_700, 30.0, 0.05)
    assert alone == pytest.approx(0.5137, abs=1e-4) and framed == pytest.approx(0.5349, abs=1e-4)
    assert framed_transfer_seconds(10**9, math.inf, 0.0) == 0.0
    with pytest.raises(ValueError):
        framed_transfer_seconds(-1, 10.0, 0.05)


def test_a_framed_server_link_queues_the_wire_bytes():
    from hermes.sim.links import wire_bytes

    plain, framed = ServerLink(8.0, 8.0), ServerLink(8.0, 8.0, framed=True)
    assert plain.reserve(0.0, 1_000_000, "up") == pytest.approx(1.0)
    assert framed.reserve(0.0, 1_000_000, "up") == pytest.approx(wire_bytes(1_000_000) * 8 / 8e6)
    assert framed.bytes["up"] == 1_000_000  # the messages' bytes are counted as sent; the headers only cost time
