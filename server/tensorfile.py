"""Tensor files in the safetensors layout, written atomically, read without pickle.

8-byte little-endian header length, a JSON header (dtype, shape and byte
offsets per tensor, plus ``__metadata__`` strings), then the raw bytes,
aligned to 8. Checkpoints, the journal's model files and the run's
``model-final``/``model-best`` files all use it; ``safetensors.torch.load_file``
reads every one of them.
"""

from __future__ import annotations

import json
import struct
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import torch

from hermes.common import atomic_write

# Integer and bool entries: the model files (model_files.py) carry a module's integer buffers too.
_ST_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
              torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
              torch.bool: "BOOL"}


class CheckpointError(Exception):
    """A checkpoint directory that cannot be written, read or resumed from."""


def write_atomic(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """A checkpoint file: replaced atomically and durably (fsynced, then its folder)."""
    atomic_write.write_atomic(path, write, durable=True)


def bytes_of(t: torch.Tensor) -> memoryview:
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().data.cast("B")


def write_tensors(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
    """A safetensors file, written atomically."""
    header: dict[str, Any] = {"__metadata__": metadata or {}}
    offset = 0
    for name, t in tensors.items():
        n = t.numel() * t.element_size()
        header[name] = {"dtype": _ST_DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the format aligns the data to 8 bytes

    def write(fh: BinaryIO) -> None:
        fh.write(struct.pack("<Q", len(raw)))
        fh.write(raw)
        for t in tensors.values():
            fh.write(bytes_of(t))

    write_atomic(path, write)


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    data = path.read_bytes()
    try:
        (n,) = struct.unpack_from("<Q", data)
        header = json.loads(data[8 : 8 + n])
        by_code = {v: k for k, v in _ST_DTYPES.items()}
        out = {}
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            begin, end = entry["data_offsets"]
            chunk = bytearray(data[8 + n + begin : 8 + n + end])
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                t = torch.frombuffer(chunk, dtype=by_code[entry["dtype"]]) if chunk else torch.empty(0)
            out[name] = t.reshape(entry["shape"]).clone()
        return out
    except (struct.error, ValueError, KeyError, TypeError, RuntimeError) as exc:
        raise CheckpointError(f"{path}: not a readable tensor file ({exc})") from None


def read_tensor_metadata(path: Path) -> dict[str, str]:
    """The ``__metadata__`` strings of a tensor file written by write_tensors."""
    try:
        with open(path, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        return dict(header.get("__metadata__") or {})
    except (OSError, struct.error, ValueError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{path}: not a readable tensor file ({exc})") from None
