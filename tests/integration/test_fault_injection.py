"""Fault injection against a real server: every bad message is refused in protocol.

Each case sends one corrupted or hostile message on the ZeroMQ data plane and
checks the whole contract: an ERROR reply with the right code (and the
request's seq when the header was readable), the matching
``hermes_errors_total{code=...}`` counter up by exactly one, the server still
healthy, and the model neither changed nor torn (a valid pull before and after
returns the same version and the same bytes).
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable
from typing import Any

import msgpack
import pytest
import torch

from hermes.common.shards import decode_record
from hermes.common.wire import MAX_HEADER_BYTES, ErrorCode, MsgType, encode

pytestmark = pytest.mark.integration


# ---------------------------------------------------------------------------
# helpers


def expected_seq(header_frame: bytes) -> int:
    """The seq the server should echo: the header's int seq when it is readable, else 0.

    A header over the size limit is not parsed at all, so its seq is not echoed.
    """
    if len(header_frame) > MAX_HEADER_BYTES:
        return 0
    try:
        obj = msgpack.unpackb(header_frame, raw=False)
    except Exception:
        return 0
    if isinstance(obj, dict):
        seq = obj.get("seq", 0)
        if isinstance(seq, int) and not isinstance(seq, bool):
            return seq
    return 0


def assert_rejected(server, worker, frames: list[bytes], code: ErrorCode) -> dict[str, Any]:
    """Send ``frames``; check the error reply, the counter, health and an untouched model."""
    # Pulls on a session of their own: ``frames`` were signed before them and must not
    # look like a replay on the worker's main session.
    worker = worker.other_session()
    v0, m0 = worker.pull()
    before = server.error_count(code.value)
    before_internal = server.error_count(ErrorCode.INTERNAL.value)

    msg = server.exchange(frames)

    assert msg.header.type is MsgType.ERROR, f"expected an error reply, got {msg.header.type}: {msg.header.body}"
    assert msg.header.body.get("code") == code.value, msg.header.body
    assert isinstance(msg.header.body.get("message"), str) and msg.header.body["message"]
    assert msg.payload is None
    assert msg.header.seq == expected_seq(frames[0])
    assert server.error_count(code.value) == before + 1
    assert server.error_count(ErrorCode.INTERNAL.value) == before_internal

    health = server.healthz()
    assert health["status"] == "ok" and health["stopping"] is False
    v1, m1 = worker.pull()
    assert v1 == v0, "a rejected message changed the model version"
    assert torch.equal(m1, m0), "a rejected message changed the model"
    return msg.header.body


def header_dict(handle, type_: MsgType = MsgType.PULL_MODEL, **overrides: Any) -> dict[str, Any]:
    """A valid header as a plain dict (easy to mutate), with ``overrides`` applied."""
    d = msgpack.unpackb(handle.frames(type_, body={})[0], raw=False)
    d["seq"] = 4242
    for k, v in overrides.items():
        if v is _DELETE:
            d.pop(k, None)
        else:
            d[k] = v
    return d


_DELETE = object()
# An honest-sized step (norm 0.58 for the cnn's 22k parameters, model norm 6.4: screening is
# on) that is a power of two, so every fold the tests check is exact, in fp16 too.
STEP = 2.0 ** -8


def packed(d: Any) -> bytes:
    return msgpack.packb(d, use_bin_type=True)


def zeros_delta(worker, dtype=torch.float32) -> torch.Tensor:
    return torch.zeros(worker.numel, dtype=dtype)


def valid_push_frames(worker, delta: torch.Tensor | None = None, *, base_version: int = 0, **kw) -> list[bytes]:
    delta = zeros_delta(worker) if delta is None else delta
    return worker.frames(
        MsgType.PUSH_UPDATE, delta, model_version=base_version, shapes=worker.shapes,
        body={"samples": 32, **kw.pop("body", {})}, **kw,
    )


def rewrite_header(frames: list[bytes], **changes: Any) -> list[bytes]:
    d = msgpack.unpackb(frames[0], raw=False)
    d.update(changes)
    return [packed(d), *frames[1:]]


@pytest.fixture(scope="module")
def worker(live_server):
    return live_server.register("fault-injector")


@pytest.fixture(scope="module")
def num_shards(live_server) -> int:
    events = [json.loads(line) for line in (live_server.out_dir / "events.jsonl").read_text().splitlines()]
    start = [e for e in events if e["event"] == "run_start"]
    assert len(start) == 1
    return int(start[0]["shards"])


# ---------------------------------------------------------------------------
# framing and header


HEADER_CASES: dict[str, tuple[Callable[[Any], list[bytes]], ErrorCode]] = {
    "random_bytes": (lambda w: [random.Random(1234).randbytes(64)], ErrorCode.MALFORMED),
    "random_bytes_with_payload": (
        lambda w: [random.Random(99).randbytes(200), random.Random(7).randbytes(4096)], ErrorCode.MALFORMED),
    "empty_header_frame": (lambda w: [b""], ErrorCode.MALFORMED),
    "truncated_header": (lambda w: (lambda f: [f[0][: len(f[0]) // 2]])(w.frames(MsgType.PULL_MODEL)),
                         ErrorCode.MALFORMED),
    "truncated_header_by_one": (lambda w: (lambda f: [f[0][:-1]])(w.frames(MsgType.PULL_MODEL)),
                                ErrorCode.MALFORMED),
    "header_with_trailing_garbage": (lambda w: [w.frames(MsgType.PULL_MODEL)[0] + b"\x00"], ErrorCode.MALFORMED),
    "header_is_list": (lambda w: [packed([1, 2, 3])], ErrorCode.MALFORMED),
    "header_is_string": (lambda w: [packed("pull_model")], ErrorCode.MALFORMED),
    "header_is_nil": (lambda w: [packed(None)], ErrorCode.MALFORMED),
    "header_is_int": (lambda w: [packed(7)], ErrorCode.MALFORMED),
    "header_int_keys": (lambda w: [packed({1: 2})], ErrorCode.MALFORMED),
    "header_empty_map": (lambda w: [packed({})], ErrorCode.MALFORMED),
    "missing_proto": (lambda w: [packed(header_dict(w, proto=_DELETE))], ErrorCode.MALFORMED),
    "missing_type": (lambda w: [packed(header_dict(w, type=_DELETE))], ErrorCode.MALFORMED),
    "proto_is_string": (lambda w: [packed(header_dict(w, proto="1"))], ErrorCode.MALFORMED),
    "proto_is_bool": (lambda w: [packed(header_dict(w, proto=True))], ErrorCode.MALFORMED),
    "type_is_int": (lambda w: [packed(header_dict(w, type=3))], ErrorCode.MALFORMED),
    "seq_is_string": (lambda w: [packed(header_dict(w, seq="12"))], ErrorCode.MALFORMED),
    "worker_is_int": (lambda w: [packed(header_dict(w, worker=1))], ErrorCode.MALFORMED),
    "mac_is_nil": (lambda w: [packed(header_dict(w, mac=None))], ErrorCode.MALFORMED),
    "ts_is_string": (lambda w: [packed(header_dict(w, ts="now"))], ErrorCode.MALFORMED),
    "model_version_is_float": (lambda w: [packed(header_dict(w, model_version=1.5))], ErrorCode.MALFORMED),
    "shapes_is_string": (lambda w: [packed(header_dict(w, shapes="22154"))], ErrorCode.MALFORMED),
    "shape_negative": (lambda w: [packed(header_dict(w, shapes=[[-1]]))], ErrorCode.MALFORMED),
    "shape_of_strings": (lambda w: [packed(header_dict(w, shapes=[["a", "b"]]))], ErrorCode.MALFORMED),
    "shape_of_bools": (lambda w: [packed(header_dict(w, shapes=[[True]]))], ErrorCode.MALFORMED),
    "frame_bytes_negative": (lambda w: [packed(header_dict(w, frame_bytes=[-4]))], ErrorCode.MALFORMED),
    "frame_bytes_is_map": (lambda w: [packed(header_dict(w, frame_bytes={"a": 1}))], ErrorCode.MALFORMED),
    "checksum_is_string": (lambda w: [packed(header_dict(w, checksum="abc"))], ErrorCode.MALFORMED),
    "dtype_is_int": (lambda w: [packed(header_dict(w, dtype=4))], ErrorCode.MALFORMED),
    "body_is_list": (lambda w: [packed(header_dict(w, body=[1, 2]))], ErrorCode.MALFORMED),
    "binary_in_header": (lambda w: [packed(header_dict(w, body={"blob": b"\x00\x01"}))], ErrorCode.MALFORMED),
    "header_too_large": (lambda w: [packed(header_dict(w, body={"pad": "x" * (MAX_HEADER_BYTES + 10)}))],
                         ErrorCode.TOO_LARGE),
    "unknown_type": (lambda w: [packed(header_dict(w, type="explode"))], ErrorCode.UNKNOWN_TYPE),
    "reply_type_model": (lambda w: [packed(header_dict(w, type=MsgType.MODEL.value))], ErrorCode.BAD_REQUEST),
    "reply_type_push_reply": (lambda w: [packed(header_dict(w, type=MsgType.PUSH_REPLY.value))],
                              ErrorCode.BAD_REQUEST),
    "reply_type_error": (lambda w: [packed(header_dict(w, type=MsgType.ERROR.value))], ErrorCode.BAD_REQUEST),
    "proto_1_bearer_tokens": (lambda w: [packed(header_dict(w, proto=1))], ErrorCode.UNSUPPORTED_VERSION),
    "proto_2_hmac_crc": (lambda w: [packed(header_dict(w, proto=2))], ErrorCode.UNSUPPORTED_VERSION),
    "proto_4": (lambda w: [packed(header_dict(w, proto=4))], ErrorCode.UNSUPPORTED_VERSION),
    "proto_0": (lambda w: [packed(header_dict(w, proto=0))], ErrorCode.UNSUPPORTED_VERSION),
    "unknown_worker": (lambda w: [packed(header_dict(w, worker="w9999"))], ErrorCode.UNKNOWN_WORKER),
    "empty_worker": (lambda w: [packed(header_dict(w, worker="", mac=""))], ErrorCode.UNKNOWN_WORKER),
    "forged_mac": (lambda w: [packed(header_dict(w, mac="ab" * 32))], ErrorCode.UNAUTHORIZED),
    "unsigned": (lambda w: w.frames(MsgType.PULL_MODEL, sign=False), ErrorCode.UNAUTHORIZED),
    "signed_with_another_key": (
        lambda w: [bytes(f) for f in encode(w.header(MsgType.PULL_MODEL), key=b"x" * 43)], ErrorCode.UNAUTHORIZED),
    "legacy_bearer_token": (lambda w: [packed(header_dict(w, token=w.token, mac=""))], ErrorCode.UNAUTHORIZED),
    "push_body_changed_after_signing": (
        lambda w: rewrite_header(valid_push_frames(w), body={"samples": 33}), ErrorCode.UNAUTHORIZED),
}


@pytest.mark.parametrize("case", sorted(HEADER_CASES))
def test_bad_header_is_refused(live_server, worker, case):
    build, code = HEADER_CASES[case]
    assert_rejected(live_server, worker, build(worker), code)


# ---------------------------------------------------------------------------
# pushes


def _nan_delta(w, value=float("nan"), dtype=torch.float32):
    d = zeros_delta(w, dtype)
    d[w.numel // 2] = value
    return d


PUSH_CASES: dict[str, tuple[Callable[[Any], list[bytes]], ErrorCode]] = {
    # shapes and lengths
    "wrong_shapes": (
        lambda w: w.frames(MsgType.PUSH_UPDATE, torch.zeros(10), shapes=((10,),), body={"samples": 1}),
        ErrorCode.BAD_SHAPE),
    "one_element_short": (
        lambda w: w.frames(MsgType.PUSH_UPDATE, torch.zeros(w.numel - 1), body={"samples": 1}), ErrorCode.BAD_SHAPE),
    "one_element_long": (
        lambda w: w.frames(MsgType.PUSH_UPDATE, torch.zeros(w.numel + 1), body={"samples": 1}), ErrorCode.BAD_SHAPE),
    "shapes_permuted": (
        lambda w: w.frames(MsgType.PUSH_UPDATE, zeros_delta(w), shapes=tuple(reversed(w.shapes)),
                           body={"samples": 1}),
        ErrorCode.BAD_SHAPE),
    "header_shapes_claim_more_than_payload": (
        lambda w: rewrite_header(valid_push_frames(w), shapes=[[w.numel + 1]]), ErrorCode.BAD_SHAPE),
    # dtypes
    "dtype_int32": (lambda w: valid_push_frames(w, zeros_delta(w, torch.int32)), ErrorCode.BAD_DTYPE),
    "dtype_int64": (lambda w: valid_push_frames(w, zeros_delta(w, torch.int64)), ErrorCode.BAD_DTYPE),
    "dtype_float64": (lambda w: valid_push_frames(w, zeros_delta(w, torch.float64)), ErrorCode.BAD_DTYPE),
    "dtype_uint8": (lambda w: valid_push_frames(w, zeros_delta(w, torch.uint8)), ErrorCode.BAD_DTYPE),
    "dtype_unknown_name": (lambda w: rewrite_header(valid_push_frames(w), dtype="complex64"), ErrorCode.BAD_DTYPE),
    # values
    "nan": (lambda w: valid_push_frames(w, _nan_delta(w)), ErrorCode.NON_FINITE),
    "pos_inf": (lambda w: valid_push_frames(w, _nan_delta(w, math.inf)), ErrorCode.NON_FINITE),
    "neg_inf": (lambda w: valid_push_frames(w, _nan_delta(w, -math.inf)), ErrorCode.NON_FINITE),
    "nan_fp16": (lambda w: valid_push_frames(w, _nan_delta(w, dtype=torch.float16)), ErrorCode.NON_FINITE),
    "inf_bf16": (lambda w: valid_push_frames(w, _nan_delta(w, math.inf, torch.bfloat16)), ErrorCode.NON_FINITE),
    "nan_in_last_frame": (
        lambda w: [bytes(f) for f in encode(
            w.header(MsgType.PUSH_UPDATE, shapes=w.shapes, body={"samples": 1}),
            torch.cat([torch.zeros(w.numel - 1), torch.tensor([math.nan])]), max_frame_bytes=8192, key=w.key)],
        ErrorCode.NON_FINITE),
    # framing
    "payload_frame_missing": (lambda w: valid_push_frames(w)[:1], ErrorCode.MALFORMED),
    "extra_payload_frame": (lambda w: valid_push_frames(w) + [b"\x00" * 8], ErrorCode.MALFORMED),
    "payload_frame_truncated": (lambda w: (lambda f: [f[0], f[1][:-4]])(valid_push_frames(w)), ErrorCode.MALFORMED),
    "payload_frame_extended": (lambda w: (lambda f: [f[0], f[1] + b"\x00" * 4])(valid_push_frames(w)),
                               ErrorCode.MALFORMED),
    "frame_bytes_disagree": (
        lambda w: (lambda f: rewrite_header(f, frame_bytes=[len(f[1]) - 4]))(valid_push_frames(w)),
        ErrorCode.MALFORMED),
    "frames_split_off_element_boundary": (
        lambda w: (lambda f: rewrite_header([f[0], f[1][:6], f[1][6:]], frame_bytes=[6, len(f[1]) - 6]))(
            valid_push_frames(w)),
        ErrorCode.MALFORMED),
    # Protocol 3: a signed push carries no CRC; its MAC catches any changed byte.
    "corrupt_payload_byte": (
        lambda w: (lambda f: [f[0], f[1][:100] + bytes([f[1][100] ^ 0x01]) + f[1][101:]])(valid_push_frames(w)),
        ErrorCode.UNAUTHORIZED),
    "checksum_set_in_signed_header": (
        lambda w: (lambda f: rewrite_header(f, checksum=(msgpack.unpackb(f[0])["checksum"] + 1) % 2**32))(
            valid_push_frames(w)),
        ErrorCode.UNAUTHORIZED),
    # request body
    "no_payload": (lambda w: w.frames(MsgType.PUSH_UPDATE, None, body={"samples": 1}), ErrorCode.BAD_REQUEST),
    "samples_missing": (lambda w: w.frames(MsgType.PUSH_UPDATE, zeros_delta(w), shapes=w.shapes, body={}),
                        ErrorCode.BAD_REQUEST),
    "samples_negative": (lambda w: valid_push_frames(w, body={"samples": -1}), ErrorCode.BAD_REQUEST),
    "samples_zero": (lambda w: valid_push_frames(w, body={"samples": 0}), ErrorCode.BAD_REQUEST),
    "samples_string": (lambda w: valid_push_frames(w, body={"samples": "32"}), ErrorCode.BAD_REQUEST),
    "samples_bool": (lambda w: valid_push_frames(w, body={"samples": True}), ErrorCode.BAD_REQUEST),
    "loss_nan": (lambda w: valid_push_frames(w, body={"loss": math.nan}), ErrorCode.BAD_REQUEST),
    "loss_string": (lambda w: valid_push_frames(w, body={"loss": "low"}), ErrorCode.BAD_REQUEST),
    "base_version_from_the_future": (lambda w: valid_push_frames(w, base_version=10**9), ErrorCode.BAD_REQUEST),
    "base_version_negative": (lambda w: valid_push_frames(w, base_version=-1), ErrorCode.BAD_REQUEST),
}


@pytest.mark.parametrize("case", sorted(PUSH_CASES))
def test_bad_push_is_refused(live_server, worker, case):
    build, code = PUSH_CASES[case]
    pushes_before = live_server.workers()[worker.id]["pushes"]
    assert_rejected(live_server, worker, build(worker), code)
    # A refused push is neither counted as a push nor applied.
    after = live_server.workers()[worker.id]
    assert after["pushes"] == pushes_before
    assert after["applied"] == 0


# ---------------------------------------------------------------------------
# shards and stats


SHARD_BODIES = {
    "negative": {"shard": -1},
    "string": {"shard": "3"},
    "float": {"shard": 1.0},
    "bool": {"shard": True},
    "missing": {},
    "huge": {"shard": 2**62},
}


@pytest.mark.parametrize("case", sorted(SHARD_BODIES))
def test_fetch_shard_bad_id(live_server, worker, case):
    frames = worker.frames(MsgType.FETCH_SHARD, body=SHARD_BODIES[case])
    body = assert_rejected(live_server, worker, frames, ErrorCode.BAD_REQUEST)
    assert "shard" in body["message"]


def test_fetch_shard_range_boundary(live_server, worker, num_shards):
    # One past the end is refused ...
    frames = worker.frames(MsgType.FETCH_SHARD, body={"shard": num_shards})
    body = assert_rejected(live_server, worker, frames, ErrorCode.BAD_REQUEST)
    assert "out of range" in body["message"]
    # ... the last one is served, and it is a verifiable record of that shard.
    msg = worker.request(MsgType.FETCH_SHARD, body={"shard": num_shards - 1})
    assert msg.header.type is MsgType.SHARD
    assert msg.header.body["shard"] == num_shards - 1
    record = decode_record(bytes(msg.payload.flat().numpy()))
    assert record.shard == num_shards - 1
    assert record.dataset == "digits"
    assert 0 < record.samples <= worker.run_config["shard_size"]
    assert record.x.shape == (record.samples, *worker.model_spec["input_shape"])


STATS_BODIES = {
    "samples_negative": {"samples": -5},
    "samples_missing": {"compute_seconds": 1.0},
    "compute_negative": {"samples": 1, "compute_seconds": -0.5},
    "compute_nan": {"samples": 1, "compute_seconds": math.nan},
    "wait_inf": {"samples": 1, "wait_seconds": math.inf},
    "prefetch_neg_inf": {"samples": 1, "prefetch_wait_seconds": -math.inf},
    "bytes_sent_negative": {"samples": 1, "bytes_sent": -1},
    "bytes_received_float": {"samples": 1, "bytes_received": 2.5},
    "compute_string": {"samples": 1, "compute_seconds": "1.0"},
}


@pytest.mark.parametrize("case", sorted(STATS_BODIES))
def test_report_stats_bad_values(live_server, worker, case):
    before = live_server.workers()[worker.id]
    frames = worker.frames(MsgType.REPORT_STATS, body=STATS_BODIES[case])
    assert_rejected(live_server, worker, frames, ErrorCode.BAD_REQUEST)
    after = live_server.workers()[worker.id]
    for key in ("samples", "compute_seconds", "wait_seconds", "bytes_sent", "bytes_received"):
        assert after[key] == before[key], f"a refused report changed {key}"


def test_report_stats_valid(live_server):
    w = live_server.register("stats-reporter")
    msg = w.request(MsgType.REPORT_STATS, body={
        "samples": 640, "compute_seconds": 1.25, "wait_seconds": 0.5, "prefetch_wait_seconds": 0.125,
        "bytes_sent": 1000, "bytes_received": 2000, "precision": "fp32",
    })
    assert msg.header.type is MsgType.STATS_ACK
    rec = live_server.workers()[w.id]
    assert (rec["samples"], rec["compute_seconds"], rec["wait_seconds"]) == (640, 1.25, 0.5)
    assert (rec["bytes_sent"], rec["bytes_received"], rec["precision"]) == (1000, 2000, "fp32")
    assert live_server.counter("hermes_worker_samples_total", worker="stats-reporter", worker_id=w.id) == 640.0
    # A running total is a counter (rate() works on it), labelled with the worker's name beside its id.
    text = live_server.metrics_text()
    for total in ("hermes_worker_samples", "hermes_worker_compute_seconds", "hermes_worker_messages"):
        assert f"# TYPE {total}_total counter" in text, total
    assert live_server.counter("hermes_worker_compute_seconds_total", worker="stats-reporter", worker_id=w.id) == 1.25


# ---------------------------------------------------------------------------
# the happy path still works


def test_valid_push_then_pull(live_server):
    w = live_server.register("honest-pusher")
    applied_before = live_server.counter("hermes_updates_total", outcome="applied")
    v0, m0 = w.pull()
    assert live_server.healthz()["model_version"] == v0

    delta = (torch.arange(w.numel, dtype=torch.float32) % 7 - 3) * 1e-3
    reply = w.push(delta, base_version=v0, samples=32, loss=0.5)
    assert reply.header.type is MsgType.PUSH_REPLY, reply.header.body
    assert reply.header.body["status"] == "applied"
    assert reply.header.body["staleness"] == 0
    assert reply.header.model_version == v0 + 1

    v1, m1 = w.pull()
    assert v1 == v0 + 1
    assert torch.equal(m1, m0 + delta), "ASP + mean with one update must fold w + delta exactly"
    assert live_server.healthz()["model_version"] == v1

    rec = live_server.workers()[w.id]
    assert (rec["pushes"], rec["applied"], rec["rejected"], rec["pulls"]) == (1, 1, 0, 2)
    assert rec["server_bytes_in"] >= delta.numel() * 4
    assert rec["server_bytes_out"] >= 2 * delta.numel() * 4
    assert live_server.counter("hermes_updates_total", outcome="applied") == applied_before + 1
    assert live_server.counter("hermes_model_version") == v1


def test_valid_multiframe_fp16_push(live_server):
    """A half-precision update split into many frames is accumulated into fp32 in place."""
    w = live_server.register("fp16-pusher")
    v0, m0 = w.pull()
    # Honest-sized (screening is on: norm 0.6 for a model of norm 6.4), exact in fp16.
    delta = torch.linspace(-(2 ** -8), 2 ** -8, w.numel).to(torch.float16)
    frames = [bytes(f) for f in encode(
        w.header(MsgType.PUSH_UPDATE, model_version=v0, shapes=w.shapes, body={"samples": 8}),
        delta, max_frame_bytes=4096, key=w.key,
    )]
    assert len(frames) > 5
    reply = live_server.exchange(frames)
    assert reply.header.type is MsgType.PUSH_REPLY and reply.header.body["status"] == "applied"
    v1, m1 = w.pull()
    assert v1 == v0 + 1
    assert torch.equal(m1, m0 + delta.float())
    # And the same model served as fp16 is the fp32 model rounded.
    v2, half = w.pull("float16")
    assert v2 == v1 and torch.equal(half, m1.half())


def test_stale_push_still_applies_under_plain_asp(live_server):
    w = live_server.register("stale-pusher")
    v0, m0 = w.pull()
    step = torch.full((w.numel,), STEP)
    first = w.push(step, base_version=v0)
    assert first.header.body["status"] == "applied"
    second = w.push(step, base_version=v0)  # computed from the old model
    assert second.header.body["status"] == "applied"
    assert second.header.body["staleness"] == 1
    v2, m2 = w.pull()
    assert v2 == v0 + 2 and torch.equal(m2, (m0 + STEP) + STEP)


def test_pull_if_newer_and_bad_pull_dtype(live_server, worker):
    v, _ = worker.pull()
    same = worker.request(MsgType.PULL_MODEL, model_version=v, body={"if_newer": True})
    assert same.header.type is MsgType.MODEL and same.header.body["unchanged"] is True and same.payload is None
    frames = worker.frames(MsgType.PULL_MODEL, body={"dtype": "int8"})
    assert_rejected(live_server, worker, frames, ErrorCode.BAD_DTYPE)


def test_garbage_flood_then_valid_pull(live_server, worker):
    """Many hostile messages on one connection: each answered, none crashes the loop."""
    import zmq

    n = 200
    rng = random.Random(5)
    before = live_server.error_count(ErrorCode.MALFORMED.value)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(live_server.data_address)
        for _ in range(n):
            sock.send_multipart([b"\xc1" + rng.randbytes(rng.randrange(0, 300))])
        replies = 0
        deadline = time.monotonic() + 120  # a hang deadline: how fast the replies come is not asserted
        while replies < n and time.monotonic() < deadline:
            if sock.poll(1000):
                frames = sock.recv_multipart()
                assert msgpack.unpackb(frames[0])["body"]["code"] == ErrorCode.MALFORMED.value
                replies += 1
    finally:
        sock.close(linger=0)
    assert replies == n
    assert live_server.error_count(ErrorCode.MALFORMED.value) == before + n
    assert live_server.healthz()["status"] == "ok"
    worker.pull()


def test_rejections_are_logged_as_warnings(live_server, worker):
    frames = [packed(header_dict(worker, mac="cd" * 32))]
    assert_rejected(live_server, worker, frames, ErrorCode.UNAUTHORIZED)
    wanted = f"bad signature from worker '{worker.id}'"
    deadline = time.monotonic() + 60  # a hang deadline: the log line may lag on a loaded machine
    while True:
        lines = [ln for ln in live_server.log_text().splitlines() if wanted in ln]
        if lines or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert lines, "no log line for a rejected message"
    assert all(" WARNING " in ln and "rejected message" in ln for ln in lines), lines


def test_server_stayed_clean(live_server, worker):
    """After everything above: no internal error, no traceback, still serving."""
    # One malformed message of its own: under xdist's worksteal this test may share its server with none
    # of the tests above (the suite failed once on a counter of 0, 2026-11-27).
    assert_rejected(live_server, worker, [b""], ErrorCode.MALFORMED)
    assert live_server.error_count(ErrorCode.INTERNAL.value) == 0
    assert live_server.error_count(ErrorCode.MALFORMED.value) > 0  # the counters really counted
    log = live_server.log_text()
    assert "Traceback" not in log, log[-4000:]
    assert " ERROR " not in log, log[-4000:]
    worker.pull()


# ---------------------------------------------------------------------------
# message size limit (a second server with a tiny limit)


SMALL_LIMIT = 60_000  # bytes: an fp32 update of the default cnn (~88.6 kB) is over, fp16 (~44.3 kB) under


@pytest.fixture(scope="module")
def small_server(server_factory):
    return server_factory("--max-message-bytes", str(SMALL_LIMIT))


def test_oversized_push_is_too_large(small_server):
    w = small_server.register("big-pusher")
    assert w.numel * 4 > SMALL_LIMIT > w.numel * 2 + 1024
    v0, m0 = w.pull()

    frames = valid_push_frames(w, torch.full((w.numel,), 0.25), base_version=v0)
    assert_rejected(small_server, w, frames, ErrorCode.TOO_LARGE)
    # Split into frames well under the limit: the whole message still counts.
    split = [bytes(f) for f in encode(
        w.header(MsgType.PUSH_UPDATE, model_version=v0, shapes=w.shapes, body={"samples": 1}),
        torch.full((w.numel,), 0.25), max_frame_bytes=8192, key=w.key,
    )]
    assert max(len(f) for f in split) < SMALL_LIMIT
    assert_rejected(small_server, w, split, ErrorCode.TOO_LARGE)

    # The same update in fp16 fits, and is applied (honest-sized: screening is on).
    reply = w.push(torch.full((w.numel,), STEP, dtype=torch.float16), base_version=v0)
    assert reply.header.type is MsgType.PUSH_REPLY and reply.header.body["status"] == "applied"
    v1, m1 = w.pull()
    assert v1 == v0 + 1 and torch.equal(m1, m0 + STEP)
    assert small_server.workers()[w.id]["pushes"] == 1


def test_single_oversized_frame_gets_a_too_large_reply(small_server):
    """One frame over the message limit (but under the socket cap of twice the limit) is
    answered in protocol, counted as too_large and as a limit hit."""
    w = small_server.register("one-big-frame")
    hits = small_server.counter("hermes_limit_hits_total", limit="max_message_bytes")
    frames = [packed(header_dict(w)), b"\x00" * (SMALL_LIMIT + 4096)]
    body = assert_rejected(small_server, w, frames, ErrorCode.TOO_LARGE)
    assert str(SMALL_LIMIT) in body["message"]
    assert small_server.counter("hermes_limit_hits_total", limit="max_message_bytes") == hits + 1


def test_frame_over_socket_limit_does_not_hurt_the_server(small_server):
    """A single frame past libzmq's MAXMSGSIZE (twice the limit) is dropped with its connection
    before it is allocated; the server and the other workers carry on."""
    w = small_server.register("other-worker")
    v0, m0 = w.pull()
    huge = [packed(header_dict(w)), b"\x00" * (4 * SMALL_LIMIT + 2 * 65536)]
    assert small_server.exchange_raw(huge, timeout=1.0) is None
    assert small_server.healthz()["status"] == "ok"
    v1, m1 = w.pull()
    assert v1 == v0 and torch.equal(m1, m0)
