"""The global model: one fp32 flat vector and a monotonically increasing version.

Thread-safe: updates are folded in executor threads (torch releases the GIL)
while the event loop keeps serving; a lock serialises writers and snapshot
readers so no pull ever sees a torn model and no update is lost.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence

import torch

from hermes.common.tensors import ModelSpec
from hermes.common.wire import (
    ErrorCode,
    Payload,
    PreparedPayload,
    ProtocolError,
    dtype_name,
    prepare,
)

# fp16/bf16 deltas are widened to fp32 in blocks of this many elements: a
# whole-vector fp32 temporary above 32 MB is fresh memory from the kernel on
# every call (glibc's mmap threshold), which tripled the cost of a 10M push.
_BLOCK = 1 << 20


def _blocks(chunk: torch.Tensor):
    n = chunk.numel()
    if n <= _BLOCK:
        yield chunk
        return
    for i in range(0, n, _BLOCK):
        yield chunk[i : i + _BLOCK]


def validate_update(spec: ModelSpec, payload: Payload | None) -> None:
    """Shape, dtype and finiteness of a pushed delta, before it touches state."""
    if payload is None:
        raise ProtocolError(ErrorCode.BAD_REQUEST, "push carries no update payload")
    name = dtype_name(payload.dtype)
    if not payload.dtype.is_floating_point or payload.dtype == torch.float64:
        raise ProtocolError(ErrorCode.BAD_DTYPE, f"updates travel as float32/float16/bfloat16, not {name}")
    if payload.shapes != spec.shapes and payload.shapes != ((spec.numel,),):
        raise ProtocolError(
            ErrorCode.BAD_SHAPE,
            f"update shapes do not match the model ({len(payload.shapes)} tensors, {payload.numel} elements; "
            f"model has {len(spec.entries)} tensors, {spec.numel} elements)",
        )
    # One fp32-accumulating pass, the norm (which screening reads too): NaN/Inf make it
    # non-finite, and so do finite elements beyond ~1.8e19 (their squares overflow; screening
    # refuses those by their norm). Only then the exact tests, each block's fp32 sum first.
    if math.isfinite(payload.norm):
        return
    for _, chunk in payload.offsets():
        for block in _blocks(chunk):
            if not torch.isfinite(block.sum(dtype=torch.float32)):
                if not bool(torch.isfinite(block).all()):
                    raise ProtocolError(ErrorCode.NON_FINITE, "update contains NaN or Inf")
                raise ProtocolError(ErrorCode.NON_FINITE, "update magnitude overflows float32")


# While a bound on max |w_i| stays below this, no fold of finite updates can
# overflow float32 (3.4e38), so the model needs no finiteness pass after a fold.
_SAFE_MAGNITUDE = 1e37


def _amax(flat: torch.Tensor) -> float:
    return float(flat.abs().max()) if flat.numel() else 0.0


class ModelState:
    def __init__(self, spec: ModelSpec, initial: torch.Tensor, version: int = 0) -> None:
        if initial.numel() != spec.numel:
            raise ValueError(f"initial vector has {initial.numel()} elements, spec {spec.numel}")
        self.spec = spec
        self._flat = initial.detach().to(torch.float32).clone().contiguous()
        # w0, the model every replica started from: from-baseline updates
        # (Hermes' G) are measured against it.
        self._baseline = self._flat.clone()
        self._version = version
        self._lock = threading.Lock()
        self._snapshots: dict[str, tuple[int, PreparedPayload]] = {}
        # The last fp32 snapshot (pulls and evaluations take one often): what a
        # fold that turns the model non-finite is rolled back to; w0 before any.
        self._good: tuple[int, torch.Tensor] | None = None
        # (bad version, version restored) of each rollback, for the engine to report.
        self.rollbacks: list[tuple[int, int]] = []
        # Upper bounds on max |w_i| and max |w0_i|: a fold of finite updates grows the model's by
        # at most sum |weight| * ||delta||_2 (the norm validation computed). While it stays below
        # _SAFE_MAGNITUDE the model is finite without a pass over it (0.2 ms of a 0.3 ms fold at 1M).
        self._bound = _amax(self._flat)
        self._baseline_bound = self._bound

    @property
    def version(self) -> int:
        return self._version

    @property
    def numel(self) -> int:
        return self._flat.numel()

    def apply(self, updates: Sequence[tuple[Payload, float]]) -> int:
        """w <- w + sum_k weight_k * delta_k as one step; returns the new version.

        Deltas arrive in fp16/bf16/fp32 and are accumulated into fp32;
        multi-frame payloads are applied chunk by chunk with no concatenation.
        """
        with self._lock:
            for payload, weight in updates:
                self._bound += abs(weight) * payload.norm
                for off, chunk in payload.offsets():
                    if chunk.dtype == torch.float32:
                        self._flat[off : off + chunk.numel()].add_(chunk, alpha=weight)
                        continue
                    for block in _blocks(chunk):
                        self._flat[off : off + block.numel()].add_(block.to(torch.float32), alpha=weight)
                        off += block.numel()
            self._version += 1
            self._keep_finite()
            return self._version

    def blend_step_norm(self, payload: Payload) -> float:
        """||(w0 + G) - w||: how far the model a from-baseline update describes is from the current one.

        What a blend moves the model by (times its weight); inf when it overflows float32.
        """
        total = 0.0
        with self._lock:
            for off, chunk in payload.offsets():
                for block in _blocks(chunk):
                    n = block.numel()
                    step = block.to(torch.float32) + self._baseline[off : off + n] - self._flat[off : off + n]
                    total += float(torch.linalg.vector_norm(step)) ** 2
                    off += n
        return math.sqrt(total) if math.isfinite(total) else math.inf

    def candidate(self, payload: Payload, *, from_current: bool = False) -> torch.Tensor:
        """w0 + G: the worker model a from-baseline update describes (Hermes Alg. 2, w_temp).

        ``from_current``: w + delta, the current model plus a since-pull change (``loss.reference`` pull).
        """
        if from_current:
            with self._lock:
                out = self._flat.clone()
        else:
            out = self._baseline.clone()
        for off, chunk in payload.offsets():
            for block in _blocks(chunk):
                out[off : off + block.numel()].add_(block.to(torch.float32))
                off += block.numel()
        return out

    def blend(self, payload: Payload, weight: float) -> int:
        """w <- (1 - weight) * w + weight * (w0 + G) as one step (Hermes Eq. 6).

        With weight = 1 this is Alg. 2's initial step, sigma <- G. Applied
        chunk by chunk in place: no full-size temporary.
        """
        if not 0.0 <= weight <= 1.0:
            raise ValueError(f"blend weight {weight} outside [0, 1]")
        with self._lock:
            self._bound = (1.0 - weight) * self._bound + weight * (self._baseline_bound + payload.norm)
            for off, chunk in payload.offsets():
                for block in _blocks(chunk):
                    n = block.numel()
                    target = self._flat[off : off + n]
                    target.mul_(1.0 - weight).add_(self._baseline[off : off + n], alpha=weight)
                    target.add_(block.to(torch.float32), alpha=weight)
                    off += n
            self._version += 1
            self._keep_finite()
            return self._version

    def _keep_finite(self) -> None:
        """Roll a non-finite fold back to the last good model (caller holds the lock).

        Checked under the lock, so no pull or snapshot ever sees the bad model.
        The version still advances: agents pull the restored model as a new one.
        """
        if self._bound < _SAFE_MAGNITUDE:  # False for inf and NaN too
            return
        if not (bool(torch.isfinite(self._flat.sum())) or bool(torch.isfinite(self._flat).all())):
            good_version, good = self._good if self._good is not None else (0, self._baseline)
            self._flat.copy_(good)
            self.rollbacks.append((self._version, good_version))
        self._bound = _amax(self._flat)

    def snapshot(self, dtype: torch.dtype = torch.float32) -> tuple[int, torch.Tensor]:
        """An immutable copy of the current model, cached per version and dtype.

        Copy-on-read keeps the hot apply path a bare axpy; a pull after N
        applies costs one copy, not N.
        """
        version, prepared = self.prepared(dtype)
        return version, prepared.tensor

    def prepared(self, dtype: torch.dtype = torch.float32) -> tuple[int, PreparedPayload]:
        """The snapshot with its wire frames and checksum, computed once per version."""
        key = dtype_name(dtype)
        with self._lock:
            cached = self._snapshots.get(key)
            if cached is not None and cached[0] == self._version:
                return cached
            version, copy = self._version, self._flat.to(dtype, copy=True)
        # Checksummed outside the lock: the copy is private and immutable.
        snap = (version, prepare(copy))
        with self._lock:
            if dtype == torch.float32:
                self._good = (version, copy)
            if version == self._version:
                self._snapshots[key] = snap
        return snap

    @property
    def baseline(self) -> torch.Tensor:
        return self._baseline

    def load(self, flat: torch.Tensor, version: int, *, baseline: torch.Tensor | None = None) -> None:
        with self._lock:
            self._flat.copy_(flat)
            if baseline is not None:
                self._baseline.copy_(baseline)
            self._version = version
            self._snapshots.clear()
            self._good = None
            self._bound = _amax(self._flat)
            self._baseline_bound = _amax(self._baseline)
