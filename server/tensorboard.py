"""``--tensorboard DIR``: the run's scalars as TensorBoard event files, fed by ``Telemetry.subscribe``.

Written by a small writer of our own instead of ``torch.utils.tensorboard``:
that one needs the ``tensorboard`` package (and its protobuf and grpc
stack, ~30 MB) on the server, for what is a handful of fixed records. The
format is stable and small: a TFRecord stream (length, masked CRC32C of the
length, payload, masked CRC32C of the payload) of ``tensorflow.Event``
protobufs whose summaries hold ``simple_value`` scalars. A test reads the
files back with TensorBoard's own ``EventAccumulator``.

Tags, one chart each (TensorBoard groups them by the part before ``/``):
``test/accuracy`` and ``test/loss`` by model version; per worker (by name)
``cycle_seconds/``, ``batch_size/``, ``dss/``, ``gate_pushes/``, ``gate_skips/`` by
the worker's cycle number; ``messages/total``, ``bytes/received`` and
``bytes/sent`` by model version, sampled at each evaluation and at the end.
"""

from __future__ import annotations

import logging
import socket
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import crc32c

from hermes.common.messages import gate_outcome
from hermes.server.engine.telemetry import Fields

log = logging.getLogger(__name__)

# Totals sampled at each evaluation: (messages, bytes received, bytes sent).
Totals = Callable[[], tuple[int, int, int]]


def _masked_crc(data: bytes) -> int:
    """TFRecord's CRC: CRC32C rotated right by 15 bits plus a constant (so a CRC of CRCs is not a CRC)."""
    crc = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field_bytes(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def encode_event(wall_time: float, step: int = 0, *, file_version: str | None = None,
                 scalars: dict[str, float] | None = None) -> bytes:
    """One ``tensorflow.Event``: wall_time (1, double), step (2, int64), file_version (3) or summary (5).

    ``Summary.value`` (1) holds ``Value{tag (1), simple_value (2, float)}``.
    """
    out = b"\x09" + struct.pack("<d", wall_time) + b"\x10" + _varint(step)
    if file_version is not None:
        out += _field_bytes(3, file_version.encode())
    if scalars:
        values = b"".join(_field_bytes(1, _field_bytes(1, tag.encode()) + b"\x15" + struct.pack("<f", value))
                          for tag, value in scalars.items())
        out += _field_bytes(5, values)
    return out


def tfrecord(payload: bytes) -> bytes:
    header = struct.pack("<Q", len(payload))
    return header + struct.pack("<I", _masked_crc(header)) + payload + struct.pack("<I", _masked_crc(payload))


class TensorBoardSink:
    """Listens to the run's facts and appends scalars to one event file in ``directory``."""

    def __init__(self, directory: str | Path, *, name_of: Callable[[str], str], totals: Totals) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        # TensorBoard finds files by "tfevents" in the name; time and host keep restarts apart.
        self.path = self.dir / f"events.out.tfevents.{time.time():.6f}.{socket.gethostname()}.hermes"
        self.name_of = name_of
        self.totals = totals
        self._lock = threading.Lock()
        self._version = 0  # of the last evaluation: the step of the traffic totals
        self._cycles: dict[str, int] = {}
        self._gate: dict[str, list[int]] = {}
        self._fh: BinaryIO | None = open(self.path, "ab")  # held for the run; close() closes it
        self._write(encode_event(time.time(), file_version="brain.Event:2"), flush=True)
        log.info("TensorBoard scalars go to %s (tensorboard --logdir %s)", self.path, self.dir)

    def __call__(self, fact: str, fields: Fields) -> None:
        if fact == "evaluation":
            self._version = fields["version"]
            tests = {f"test/{name}": value for name, value in (fields.get("metrics") or {}).items()}
            if fields["accuracy"] is not None:
                tests["test/accuracy"] = fields["accuracy"]
            self._scalars(self._version, {**tests, "test/loss": fields["loss"], **self._traffic()}, flush=True)
        elif fact == "cycle":
            name = self.name_of(fields["worker"])
            with self._lock:
                step = self._cycles[name] = self._cycles.get(name, 0) + 1
                gate = self._gate.setdefault(name, [0, 0])
                outcome = gate_outcome(fields["decision"], fields["pushed"])  # as the registry counts
                gate[0] += outcome == "push"
                gate[1] += outcome == "skip"
                pushes, skips = gate
            self._scalars(step, {
                f"cycle_seconds/{name}": fields["compute_seconds"], f"batch_size/{name}": fields["batch_size"],
                f"dss/{name}": fields["dss"], f"gate_pushes/{name}": pushes, f"gate_skips/{name}": skips,
            })

    def _traffic(self) -> dict[str, float]:
        messages, received, sent = self.totals()
        return {"messages/total": messages, "bytes/received": received, "bytes/sent": sent}

    def _scalars(self, step: int, scalars: dict[str, float], flush: bool = False) -> None:
        self._write(encode_event(time.time(), step, scalars={k: float(v) for k, v in scalars.items()}), flush)

    def _write(self, payload: bytes, flush: bool = False) -> None:
        with self._lock:
            if self._fh is None:
                return
            try:
                self._fh.write(tfrecord(payload))
                if flush:  # at evaluations: a live TensorBoard sees the run as it goes
                    self._fh.flush()
            except OSError as exc:
                # A full disk costs the charts, not the run.
                log.error("writing TensorBoard scalars to %s failed, no more will be written: %s", self.path, exc)
                self._fh.close()
                self._fh = None

    def close(self) -> None:
        """The run's final totals (traffic after the last evaluation included), then the file is closed."""
        self._scalars(self._version, self._traffic())
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None
