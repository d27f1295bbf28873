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


# Retired snapshot buffers kept per dtype: a pull of version v+1 usually finds v's free.
_POOL_PER_DTYPE = 3


def _unshared(buf: torch.Tensor) -> bool:
    """True when nothing but ``buf`` itself holds its memory: no tensor view, no numpy array,
    no wire frame in flight (each holds the storage). The probe's own storage object counts
    one. Without torch's use count (an internal function) a buffer is never reused."""
    use_count = getattr(torch._C, "_storage_Use_Count", None)
    if use_count is None:
        return False
    return bool(use_count(buf.untyped_storage()._cdata) <= 2)


def _amax(flat: torch.Tensor) -> float:
    return float(flat.abs().max()) if flat.numel() else 0.0


class ModelState:
    def __init__(self, spec: ModelSpec, initial: torch.Tensor, version: int = 0) -> None:
        if initial.numel() != spec.numel:
            raise ValueError(f"initial vector has {initial.numel()} elements, spec {spec.numel}")
        self.spec = spec
        self._flat = initial.detach().to(torch.float32).clone().contiguous()
        # Variances cannot be negative. Folds add deltas, so a BatchNorm running_var that several
        # workers (or a stale delta) moved down goes below zero, and the next forward is NaN: the
        # edge-resnet server refused 19 of 42 pushes as "candidate loss nan" on lte (2026-11-27).
        # Each fold projects these entries back onto [0, inf).
        self._nonneg: list[tuple[int, int]] = []
        off = 0
        for name, shape in spec.entries:
            n = math.prod(shape)
            if name.endswith("running_var"):
                self._nonneg.append((off, off + n))
            off += n
        # w0, the model every replica started from: from-baseline updates
        # (Hermes' G) are measured against it.
        self._baseline = self._flat.clone()
        self._version = version
        self._lock = threading.Lock()
        self._snapshots: dict[str, tuple[int, PreparedPayload]] = {}
        # Retired snapshot buffers by dtype, reused when unshared (_spare, _retire).
        self._pool: dict[torch.dtype, list[torch.Tensor]] = {}
        # True once the current fp32 model is handed out as a snapshot (zero-copy): it is then never
        # written again, and the next fold writes the new version into another buffer (_own, apply).
        self._published = False
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
            for i, (payload, weight) in enumerate(updates):
                self._bound += abs(weight) * payload.norm
                # The model is a published snapshot: w + delta goes into another buffer, as cheap
                # as the in-place add, and the snapshot stays as it was (no copy on the pull).
                dst = self._fresh() if i == 0 and self._published and payload.numel == self.numel else None
                if dst is None:
                    self._own()
                # fp32 chunks as they are; a half-precision update through the fp32 copy its
                # validation made (Payload.widened), else widened block by block.
                for off, piece in payload.fp32_pieces():
                    n = piece.numel()
                    if dst is None:
                        self._flat[off : off + n].add_(piece, alpha=weight)
                    else:
                        torch.add(self._flat[off : off + n], piece, alpha=weight, out=dst[off : off + n])
                if dst is not None:
                    self._swap(dst)
                payload.release_widened()
            self._version += 1
            self._keep_finite()
            return self._version

    def blend_step_norm(self, payload: Payload) -> float:
        """||(w0 + G) - w||: how far the model a from-baseline update describes is from the current one.

        What a blend moves the model by (times its weight); inf when it overflows float32.
        """
        total = 0.0
        with self._lock:
            for off, piece in payload.fp32_pieces(_BLOCK):
                n = piece.numel()
                step = piece + self._baseline[off : off + n] - self._flat[off : off + n]
                total += float(torch.linalg.vector_norm(step)) ** 2
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
        for off, piece in payload.fp32_pieces():
            out[off : off + piece.numel()].add_(piece)
        self._project(out)  # the model a fold would make, as the fold would make it
        return out

    def _project(self, flat: torch.Tensor) -> None:
        """Variances (``running_var``) onto [0, inf), in place: what a fold may not leave negative."""
        for lo, hi in self._nonneg:
            flat[lo:hi].clamp_(min=0.0)

    def blend(self, payload: Payload, weight: float) -> int:
        """w <- (1 - weight) * w + weight * (w0 + G) as one step (Hermes Eq. 6).

        With weight = 1 this is Alg. 2's initial step, sigma <- G. Applied
        chunk by chunk in place: no full-size temporary.
        """
        if not 0.0 <= weight <= 1.0:
            raise ValueError(f"blend weight {weight} outside [0, 1]")
        with self._lock:
            self._own()
            self._bound = (1.0 - weight) * self._bound + weight * (self._baseline_bound + payload.norm)
            for off, piece in payload.fp32_pieces(_BLOCK):
                n = piece.numel()
                target = self._flat[off : off + n]
                target.mul_(1.0 - weight).add_(self._baseline[off : off + n], alpha=weight)
                target.add_(piece, alpha=weight)
            payload.release_widened()
            self._version += 1
            self._keep_finite()
            return self._version

    def _keep_finite(self) -> None:
        """Project variances onto [0, inf), then roll a non-finite fold back to the last good model (caller
        holds the lock).

        Checked under the lock, so no pull or snapshot ever sees the bad model.
        The version still advances: agents pull the restored model as a new one.
        """
        self._project(self._flat)
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
        applies costs one copy, not N. In fp32 the copy is the model itself,
        published: the next fold writes a new buffer instead (``apply``).
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
            version = self._version
            if dtype == torch.float32:
                copy = self._flat  # zero-copy: published, never written again (apply, _own)
                self._published = True
            else:
                spare = self._spare(dtype)
                copy = spare.copy_(self._flat) if spare is not None else self._flat.to(dtype, copy=True)
        # Framed outside the lock: the copy is private and immutable.
        snap = (version, prepare(copy))
        with self._lock:
            if dtype == torch.float32:
                self._good = (version, copy)
            if version == self._version:
                old = self._snapshots.get(key)
                self._snapshots[key] = snap
                if old is not None and dtype != torch.float32:  # fp32 ones retire in _swap
                    self._retire(old[1].tensor)
            elif dtype != torch.float32:
                self._retire(copy)
        return snap

    def _fresh(self) -> torch.Tensor:
        """A buffer for the next fp32 model: a reusable retired one, else new memory."""
        buf = self._spare(torch.float32)
        return buf if buf is not None else torch.empty_like(self._flat)

    def _swap(self, new_flat: torch.Tensor) -> None:
        """Make ``new_flat`` the model; the old one stays with whoever holds it (caller holds the lock)."""
        self._retire(self._flat)
        self._flat, self._published = new_flat, False

    def _own(self) -> None:
        """Before writing the model in place: a published one is copied first (caller holds the lock)."""
        if self._published:
            self._swap(self._fresh().copy_(self._flat))

    def _spare(self, dtype: torch.dtype) -> torch.Tensor | None:
        """A retired snapshot buffer whose memory nothing holds any more, to copy the next
        snapshot into (caller holds the lock). A fresh 4 MB buffer page-faults on every pull
        right after a push: 3 ms of a 1M-parameter pull under load (issue 17), a reused one not."""
        pool = self._pool.get(dtype, [])
        for i, buf in enumerate(pool):
            if _unshared(buf):
                return pool.pop(i)
        return None

    def _retire(self, snapshot: torch.Tensor) -> None:
        """Keep a snapshot's memory for reuse once its last reader lets go (caller holds the lock).
        The pool keeps an alias (``detach``: its own tensor, the same memory), never the object
        handed out, so whoever still holds that object shows in the memory's use count."""
        pool = self._pool.setdefault(snapshot.dtype, [])
        ptr = snapshot.untyped_storage().data_ptr()
        # One alias per buffer: two would hold each other's memory and never look unshared.
        if len(pool) < _POOL_PER_DTYPE and all(b.untyped_storage().data_ptr() != ptr for b in pool):
            pool.append(snapshot.detach())

    @property
    def baseline(self) -> torch.Tensor:
        return self._baseline

    def load(self, flat: torch.Tensor, version: int, *, baseline: torch.Tensor | None = None) -> None:
        with self._lock:
            self._own()
            self._flat.copy_(flat)
            if baseline is not None:
                self._baseline.copy_(baseline)
            self._version = version
            self._snapshots.clear()
            self._good = None
            self._bound = _amax(self._flat)
            self._baseline_bound = _amax(self._baseline)
