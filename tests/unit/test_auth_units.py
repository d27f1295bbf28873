"""Pure parts of security and fault tolerance: signatures, replay guard, rate
limiter, secrets, shard requeueing, checkpoint files and the update journal."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hermes.common.clock import ManualClock
from hermes.common.shards import ShardQueue
from hermes.common.signing import new_session, now_ms
from hermes.common.wire import (
    ErrorCode,
    Header,
    MsgType,
    ProtocolError,
    decode,
    encode,
    verify_mac,
)
from hermes.server.auth import (
    AuthConfigError,
    RateLimiter,
    ReplayGuard,
    bearer,
    read_secret,
    token_matches,
)
from hermes.server.checkpoint import Journal, read_journal
from hermes.server.tensorfile import read_tensors, write_tensors

KEY = b"k" * 43


def _signed(type_=MsgType.PUSH_UPDATE, payload=None, key=KEY, **kw):
    kw.setdefault("worker", "w0001")
    kw.setdefault("session", "abcd")
    kw.setdefault("seq", 1)
    kw.setdefault("ts", now_ms())
    return [bytes(f) for f in encode(Header(type=type_, body={"samples": 3}, **kw), payload, key=key)]


# ---------------------------------------------------------------------------
# signatures


def test_signed_message_verifies_and_every_tamper_fails():
    frames = _signed(payload=torch.arange(10, dtype=torch.float32))
    msg = decode(frames)
    # Version 3: a 16-byte Poly1305 tag under a one-time key picked by a 16-byte nonce; no CRC.
    assert len(msg.header.mac) == 32 and len(msg.header.nonce) == 32 and msg.header.checksum == 0
    assert verify_mac(frames[0], msg.header, frames[1:], KEY)
    assert not verify_mac(frames[0], msg.header, frames[1:], b"another key")
    # Every header field is covered: the same header with one field changed, signed by someone
    # without the key (here: re-packed keeping the old MAC) ...
    for field, value in [("worker", "w0002"), ("session", "other"), ("seq", 2), ("ts", 1), ("model_version", 9),
                         ("body", {"samples": 4}), ("type", MsgType.PULL_MODEL), ("checksum", 5),
                         ("nonce", "f" * 32)]:
        forged = replace(msg.header, **{field: value})
        assert not verify_mac(forged.pack(), forged, frames[1:], KEY), field
    # ... and every payload byte.
    flipped = bytearray(frames[1])
    flipped[7] ^= 1
    assert not verify_mac(frames[0], msg.header, [bytes(flipped)], KEY)
    for mac in ("", "0" * 32, "0" * 64):
        forged = replace(msg.header, mac=mac)
        assert not verify_mac(forged.pack(), forged, frames[1:], KEY)


def test_every_signed_message_has_a_fresh_nonce_and_tag():
    """The one-time key must never repeat: the same header signed twice gets two nonces and two tags."""
    a, b = (decode(_signed(payload=torch.ones(4))).header for _ in range(2))
    assert a.nonce != b.nonce and a.mac != b.mac


def test_version_2_messages_are_refused_with_the_reason():
    import msgpack

    raw = msgpack.packb({"type": "push_update", "proto": 2, "worker": "w0001", "mac": "0" * 64})
    with pytest.raises(ProtocolError) as ei:
        decode([raw])
    assert ei.value.code is ErrorCode.UNSUPPORTED_VERSION
    assert "version 2 unsupported; this peer speaks 3" in ei.value.message and "Poly1305" in ei.value.message


def test_unsigned_encoding_is_unchanged_and_multiframe_signs_all_frames():
    assert decode(_signed(key=None)).header.mac == ""
    frames = [bytes(f) for f in encode(Header(type=MsgType.PUSH_UPDATE, session="s", seq=1),
                                        torch.ones(1000), max_frame_bytes=512, key=KEY)]
    assert len(frames) > 5
    h = decode(frames).header
    assert verify_mac(frames[0], h, frames[1:], KEY)
    assert not verify_mac(frames[0], h, frames[1:-1] + [frames[-1][:-4] + b"\0\0\0\0"], KEY)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_fuzz_mutated_signed_messages_never_verify(data):
    """Any change to a signed message's bytes is either undecodable or unverifiable."""
    frames = _signed(payload=torch.arange(6, dtype=torch.float16))
    i = data.draw(st.integers(0, len(frames) - 1))
    j = data.draw(st.integers(0, len(frames[i]) - 1))
    bit = data.draw(st.integers(0, 7))
    mutated = list(frames)
    b = bytearray(mutated[i])
    b[j] ^= 1 << bit
    mutated[i] = bytes(b)
    try:
        msg = decode(mutated)
    except ProtocolError:
        return
    assert not verify_mac(mutated[0], msg.header, mutated[1:], KEY)


# ---------------------------------------------------------------------------
# replays


def test_replay_guard_rules():
    g = ReplayGuard(window_seconds=60, max_sessions=3)
    h = decode(_signed(seq=5)).header
    g.check(h)
    with pytest.raises(ProtocolError) as ei:
        g.check(h)  # the same message again
    assert ei.value.code is ErrorCode.REPLAY
    with pytest.raises(ProtocolError):
        g.check(replace(h, seq=4))  # older
    g.check(replace(h, seq=6))
    g.check(replace(h, session="other", seq=1))  # sessions are independent
    g.check(replace(h, worker="w0002", seq=1))  # so are workers
    for ts in (now_ms() - 61_000, now_ms() + 61_000):
        with pytest.raises(ProtocolError) as ei:
            g.check(replace(h, seq=100, ts=ts))
        assert ei.value.code is ErrorCode.REPLAY and "timestamp" in ei.value.message
    with pytest.raises(ProtocolError):
        g.check(replace(h, session="", seq=100))
    g.check(replace(h, session="third", seq=1))
    with pytest.raises(ProtocolError) as ei:  # a fourth live session is refused, none evicted
        g.check(replace(h, session="fourth", seq=1))
    assert "sessions" in ei.value.message
    with pytest.raises(ProtocolError):
        g.check(h)  # still remembered
    g.forget("w0001")
    g.check(replace(h, seq=1))


def test_replay_guard_expires_idle_sessions_only_after_twice_the_window():
    # A manual clock: with the real one a slow moment between two checks expired the session early.
    clock = ManualClock()
    g = ReplayGuard(window_seconds=0.05, max_sessions=1, clock=clock)

    def now() -> int:
        return int(clock.time() * 1000)

    h = replace(decode(_signed(seq=1, ts=now())).header, session=new_session())
    g.check(h)
    with pytest.raises(ProtocolError):
        g.check(replace(h, session=new_session(), ts=now()))
    clock.advance(0.12)
    g.check(replace(h, session=new_session(), ts=now()))
    with pytest.raises(ProtocolError):  # the forgotten session's old message is stale by now
        g.check(h)


# ---------------------------------------------------------------------------
# credentials and limits


def test_rate_limiter_bucket_and_retry_after():
    clock = ManualClock()  # the real one refilled the bucket when the machine paused between calls
    rl = RateLimiter(rate=10.0, burst=3, clock=clock)
    assert [rl.allow("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    wait = rl.allow("a")
    assert 0 < wait <= 0.1
    assert rl.allow("b") == 0.0  # per address
    clock.advance(0.12)
    assert rl.allow("a") == 0.0
    assert RateLimiter(rate=0, burst=1).allow("a") == 0.0  # 0 = off


def test_rate_limiter_table_is_bounded():
    rl = RateLimiter(rate=1.0, burst=2, max_clients=50)
    for i in range(500):
        rl.allow(f"10.0.{i // 256}.{i % 256}")
    assert len(rl._buckets) <= 51


def test_read_secret(tmp_path):
    assert read_secret(None, None, "join_token") is None
    assert read_secret("x" * 16, None, "join_token") == "x" * 16
    f = tmp_path / "tok"
    f.write_text("\n  " + "y" * 20 + "  \nignored\n")
    assert read_secret(None, str(f), "join_token") == "y" * 20
    with pytest.raises(AuthConfigError, match="join_token must be at least 16"):
        read_secret("short", None, "join_token")
    with pytest.raises(AuthConfigError, match="not both"):
        read_secret("x" * 16, str(f), "join_token")
    with pytest.raises(AuthConfigError, match="join_token_file"):
        read_secret(None, str(tmp_path / "missing"), "join_token")
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(AuthConfigError, match="empty"):
        read_secret(None, str(tmp_path / "empty"), "join_token")


def test_bearer_and_token_matches():
    assert bearer("Bearer abc") == "abc" and bearer("bearer  abc ") == "abc"
    assert bearer("Basic abc") == "" and bearer("") == ""
    assert token_matches("abc", "abc") and not token_matches("abd", "abc") and not token_matches("", None)


# ---------------------------------------------------------------------------
# shard requeueing


def test_requeued_shards_come_first_and_state_round_trips():
    q = ShardQueue(10, seed=3)
    first = q.take(4).shards
    q.take(2)
    q.requeue(first[:2])
    again = q.take(3)
    assert again.shards[:2] == first[:2]
    q.requeue([first[3]])
    state = q.state()
    r = ShardQueue(10, seed=3)
    r.restore(state)
    assert r.take(5).shards == q.take(5).shards
    with pytest.raises(ValueError):
        q.requeue([10])
    with pytest.raises(ValueError):
        ShardQueue(11, seed=3).restore(state)


# ---------------------------------------------------------------------------
# checkpoint files


def test_tensor_file_round_trip_and_safetensors_layout(tmp_path):
    tensors = {"model": torch.randn(17), "baseline": torch.randn(3, 2), "half": torch.randn(5).half()}
    path = tmp_path / "m.safetensors"
    write_tensors(path, tensors, {"version": "7"})
    back = read_tensors(path)
    assert set(back) == set(tensors)
    for k, v in tensors.items():
        assert back[k].dtype == v.dtype and torch.equal(back[k], v)
    assert not list(tmp_path.glob("*.tmp"))
    safetensors = pytest.importorskip("safetensors.torch")
    loaded = safetensors.load_file(str(path))
    assert torch.equal(loaded["baseline"], tensors["baseline"])


def test_journal_round_trip_and_torn_tail(tmp_path):
    from hermes.common.wire import Payload

    path = tmp_path / "journal-0.log"
    j = Journal(path)
    deltas = [torch.randn(8), torch.randn(8).half()]
    for v, d in enumerate(deltas, start=1):
        j.append(v, "apply", [Payload(d.dtype, (d[:3], d[3:]), ((8,),))], [0.5])
    j.close()
    records = read_journal(path)
    assert [h["version"] for h, _ in records] == [1, 2]
    assert all(torch.equal(got[0], d) for (_, got), d in zip(records, deltas))
    whole = path.read_bytes()
    path.write_bytes(whole[:-3])  # died mid-write: the last record was never acknowledged
    assert [h["version"] for h, _ in read_journal(path)] == [1]
    corrupt = bytearray(whole)
    corrupt[-10] ^= 0xFF
    path.write_bytes(bytes(corrupt))
    assert [h["version"] for h, _ in read_journal(path)] == [1]
