"""``--tensorboard DIR``: the run's scalars as TensorBoard event files, fed by ``Telemetry.subscribe``.

Written with ``tensorboardX`` (protobuf only, no TensorFlow or grpc; imported
only when ``--tensorboard`` is given). It replaced a hand-written TFRecord
and protobuf encoder of 60 lines (issue 30). A test reads the files back with
TensorBoard's own ``EventAccumulator``.

Tags, one chart each (TensorBoard groups them by the part before ``/``):
``test/accuracy`` and ``test/loss`` by model version; per worker (by name)
``cycle_seconds/``, ``batch_size/``, ``dss/``, ``gate_pushes/``, ``gate_skips/`` by
the worker's cycle number; ``messages/total``, ``bytes/received`` and
``bytes/sent`` by model version, sampled at each evaluation and at the end.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hermes.common.messages import gate_outcome
from hermes.server.engine.telemetry import Fields

log = logging.getLogger(__name__)

# Totals sampled at each evaluation: (messages, bytes received, bytes sent).
Totals = Callable[[], tuple[int, int, int]]


class TensorBoardSink:
    """Listens to the run's facts and appends scalars to one event file in ``directory``."""

    def __init__(self, directory: str | Path, *, name_of: Callable[[str], str], totals: Totals) -> None:
        from tensorboardX import SummaryWriter  # the server extra; only a --tensorboard run pays its import

        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.name_of = name_of
        self.totals = totals
        self._lock = threading.Lock()
        self._version = 0  # of the last evaluation: the step of the traffic totals
        self._cycles: dict[str, int] = {}
        self._gate: dict[str, list[int]] = {}
        # Flushed at every evaluation (a live TensorBoard sees the run as it goes) and at close.
        self._writer: Any = SummaryWriter(logdir=str(self.dir), flush_secs=30, filename_suffix=".hermes")
        self.path = self.dir
        log.info("TensorBoard scalars go to %s (tensorboard --logdir %s)", self.dir, self.dir)

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
        with self._lock:
            if self._writer is None:
                return
            try:
                now = time.time()
                for tag, value in scalars.items():
                    self._writer.add_scalar(tag, float(value), step, walltime=now)
                if flush:
                    self._writer.flush()
            except OSError as exc:
                # A full disk costs the charts, not the run.
                log.error("writing TensorBoard scalars to %s failed, no more will be written: %s", self.path, exc)
                self._close_writer()

    def _close_writer(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            try:
                writer.close()
            except OSError as exc:
                log.error("closing TensorBoard file %s: %s", self.path, exc)

    def close(self) -> None:
        """The run's final totals (traffic after the last evaluation included), then the file is closed."""
        self._scalars(self._version, self._traffic())
        with self._lock:
            self._close_writer()
