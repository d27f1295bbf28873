"""The global model: one fp32 flat vector and a monotonically increasing version.

Thread-safe: updates are folded in executor threads (torch releases the GIL)
while the event loop keeps serving; a lock serialises writers and snapshot
readers so no pull ever sees a torn model and no update is lost.
"""

from __future__ import annotations

import threading
from typing import Sequence

import torch

from hermes.common.tensors import ModelSpec
from hermes.common.wire import ErrorCode, Payload, ProtocolError, dtype_name


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
    for _, chunk in payload.offsets():
        # One fp32-accumulating pass: NaN/Inf propagate into the sum. Only when
        # the sum is not finite do we pay for the exact per-element test.
        if not torch.isfinite(chunk.sum(dtype=torch.float32)):
            if not bool(torch.isfinite(chunk).all()):
                raise ProtocolError(ErrorCode.NON_FINITE, "update contains NaN or Inf")
            raise ProtocolError(ErrorCode.NON_FINITE, "update magnitude overflows float32")


class ModelState:
    def __init__(self, spec: ModelSpec, initial: torch.Tensor, version: int = 0) -> None:
        if initial.numel() != spec.numel:
            raise ValueError(f"initial vector has {initial.numel()} elements, spec {spec.numel}")
        self.spec = spec
        self._flat = initial.detach().to(torch.float32).clone().contiguous()
        self._version = version
        self._lock = threading.Lock()
        self._snapshots: dict[str, tuple[int, torch.Tensor]] = {}

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
                for off, chunk in payload.offsets():
                    target = self._flat[off : off + chunk.numel()]
                    if chunk.dtype == torch.float32:
                        target.add_(chunk, alpha=weight)
                    else:
                        target.add_(chunk.to(torch.float32), alpha=weight)
            self._version += 1
            return self._version

    def snapshot(self, dtype: torch.dtype = torch.float32) -> tuple[int, torch.Tensor]:
        """An immutable copy of the current model, cached per version and dtype.

        Copy-on-read keeps the hot apply path a bare axpy; a pull after N
        applies costs one copy, not N.
        """
        key = dtype_name(dtype)
        with self._lock:
            cached = self._snapshots.get(key)
            if cached is not None and cached[0] == self._version:
                return cached
            snap = self._snapshots[key] = (self._version, self._flat.to(dtype, copy=True))
            return snap

    def load(self, flat: torch.Tensor, version: int) -> None:
        with self._lock:
            self._flat.copy_(flat)
            self._version = version
            self._snapshots.clear()
