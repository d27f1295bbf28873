"""Compression of updates and models on the wire: the ``compression`` policy kind, one per direction.

``compression.push`` compresses what an agent pushes (the change of its model),
``compression.pull`` what the server sends back (the model). Each codec is a
registered policy whose parameters live in its own section (``int8.chunk``,
``topk.ratio``, ``powersgd.rank``); ``compression.error_feedback`` switches the
residual on the compressing side (Karimireddy et al. 2019, EF-SGD).

A codec turns an fp32 vector into one byte buffer and back (``encode`` /
``decode``); the receiver's decoder is stateless and bounded by the model's
spec: the byte count a buffer must have follows from the spec's shapes and the
``CodecSpec`` that travels with it in the message body, and anything else is
refused. State lives on the sender only (the EF residual, PowerSGD's warm start
``Q``, the stochastic-rounding generator) and round-trips through
``state_dict`` / ``load_state_dict``, so a resumed sender continues exactly.

Layouts (little endian, one buffer):

- ``fp16`` / ``bf16``: the n halves.
- ``int8`` (QSGD, Alistarh et al. 2017, with s = 127 levels and one scale per
  chunk as 8-bit hivemind does): ceil(n / chunk) fp32 scales, then n int8.
- ``topk`` (Lin et al. 2018, DGC; Stich et al. 2018): k int32 indices, then k fp32 values.
- ``powersgd`` (Vogels et al. 2019, Alg. 1): in spec order, for a matrix-shaped
  entry that rank r compresses ((m + n) r < m n) the fp32 factors P (m x r) then
  Q (n x r); every other entry (vectors, biases) as its fp32 values.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from hermes.common.policies.base import Core, Policy, canonical, get, register

log = logging.getLogger(__name__)

Shapes = Sequence[tuple[int, ...]]

CODEC_NAMES = ("none", "fp16", "bf16", "int8", "topk", "powersgd")
# Bounds of what a receiver accepts in a CodecSpec (the buffer's size follows from them and the spec).
MAX_CHUNK = 1 << 20
MAX_RANK = 64


class CompressionParams(BaseModel):
    """The run config's ``compression`` section: the codec of each direction and the error-feedback switch."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    push: str = Field(default="none", description="Codec of pushed updates: none, fp16, bf16, int8, topk, powersgd.")
    pull: str = Field(default="none", description="Codec of the model agents receive: none, fp16, bf16, int8 "
                                                  "(topk and powersgd compress changes, not models: refused).")
    error_feedback: bool = Field(
        default=True, description="Keep what the push codec dropped and add it to the next push (Karimireddy et al. "
                                  "2019, EF-SGD Alg. 2); false: drop it (the paper's biased baseline).")


class Int8Params(BaseModel):
    """The run config's ``int8`` section (codec 'int8')."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    chunk: int = Field(default=1024, ge=16, le=MAX_CHUNK, description="Elements per fp32 scale (4 bytes per chunk "
                                                                         "on top of one byte per element).")
    stochastic: bool = Field(default=True, description="Stochastic rounding (QSGD: unbiased, error < one step); "
                                                       "false: round to nearest (error <= half a step, biased).")


class TopKParams(BaseModel):
    """The run config's ``topk`` section (codec 'topk')."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    # 8 bytes per kept element: a ratio of 1/16 is 1/8 of fp32's bytes.
    ratio: float = Field(default=0.01, gt=0.0, le=1.0, description="Share of the elements kept (the largest by "
                                                                   "magnitude); 8 bytes each.")


class PowerSgdParams(BaseModel):
    """The run config's ``powersgd`` section (codec 'powersgd')."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    rank: int = Field(default=4, ge=1, le=MAX_RANK, description="Rank r of each matrix's approximation P Q^T "
                                                                "(Vogels et al. 2019).")


class CodecSpec(BaseModel):
    """What a receiver needs to decode a buffer besides the model's spec; travels in the message body."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: Literal["fp16", "bf16", "int8", "topk", "powersgd"]
    chunk: int | None = Field(default=None, ge=16, le=MAX_CHUNK)
    k: int | None = Field(default=None, ge=0)
    rank: int | None = Field(default=None, ge=1, le=MAX_RANK)


class CodecError(ValueError):
    """A buffer that does not match its CodecSpec and the model's spec."""


@dataclass
class Encoded:
    """One compressed vector: the bytes to send and what decodes them."""

    data: torch.Tensor  # uint8, contiguous
    spec: CodecSpec

    @property
    def nbytes(self) -> int:
        return self.data.numel()


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def _view(data: torch.Tensor, off: int, n: int, dtype: torch.dtype) -> tuple[torch.Tensor, int]:
    size = n * torch.empty(0, dtype=dtype).element_size()
    # clone: the received frame may be read-only and unaligned for the wider dtype.
    return data[off : off + size].clone().view(dtype), off + size


def _numel(shapes: Shapes) -> int:
    return sum(math.prod(s) for s in shapes)


class Codec:
    """A codec object of one run and direction; stateless unless a subclass says otherwise."""

    name: ClassVar[str] = ""

    def encode(self, flat: torch.Tensor, shapes: Shapes) -> Encoded:
        raise NotImplementedError

    @staticmethod
    def expected_bytes(spec: CodecSpec, shapes: Shapes) -> int:
        raise NotImplementedError

    @staticmethod
    def decode_data(data: torch.Tensor, spec: CodecSpec, shapes: Shapes) -> torch.Tensor:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore for a stateless codec."""


class HalfCodec(Codec):
    dtype: ClassVar[torch.dtype] = torch.float16

    def encode(self, flat: torch.Tensor, shapes: Shapes) -> Encoded:
        return Encoded(_bytes(flat.to(self.dtype)), CodecSpec(name=self.name))  # type: ignore[arg-type]

    @classmethod
    def expected_bytes(cls, spec: CodecSpec, shapes: Shapes) -> int:
        return 2 * _numel(shapes)

    @classmethod
    def decode_data(cls, data: torch.Tensor, spec: CodecSpec, shapes: Shapes) -> torch.Tensor:
        return _view(data, 0, _numel(shapes), cls.dtype)[0].to(torch.float32)


class Fp16Codec(HalfCodec):
    name = "fp16"
    dtype = torch.float16


class Bf16Codec(HalfCodec):
    name = "bf16"
    dtype = torch.bfloat16


class Int8Codec(Codec):
    """QSGD (Alistarh et al. 2017, Sec. 3.1) with s = 127 levels, the norm replaced by each chunk's max |x| (as
    hivemind's 8-bit codecs do): q_i = sign(x_i) * xi_i(x, s), unbiased with stochastic rounding; the error of an
    element is below one step, scale = max|x| / 127, of its chunk (half a step with nearest rounding)."""

    name = "int8"

    def __init__(self, chunk: int, stochastic: bool, seed: int) -> None:
        self.chunk, self.stochastic = chunk, stochastic
        self.gen = torch.Generator().manual_seed(seed)

    def encode(self, flat: torch.Tensor, shapes: Shapes) -> Encoded:
        n = flat.numel()
        pad = -n % self.chunk
        x = torch.nn.functional.pad(flat.float(), (0, pad)).view(-1, self.chunk)
        scale = x.abs().amax(dim=1) / 127.0
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        y = x / safe[:, None]
        if self.stochastic:
            # floor(y + u), u ~ U[0, 1): E = y (QSGD Lemma 3.1's unbiasedness).
            y = torch.floor(y + torch.rand(y.shape, generator=self.gen))
        else:
            y = torch.round(y)
        q = y.clamp_(-127, 127).to(torch.int8).reshape(-1)[:n]
        data = torch.cat([_bytes(scale.to(torch.float32)), _bytes(q)])
        return Encoded(data, CodecSpec(name="int8", chunk=self.chunk))

    @staticmethod
    def expected_bytes(spec: CodecSpec, shapes: Shapes) -> int:
        n = _numel(shapes)
        assert spec.chunk is not None
        return 4 * math.ceil(n / spec.chunk) + n

    @staticmethod
    def decode_data(data: torch.Tensor, spec: CodecSpec, shapes: Shapes) -> torch.Tensor:
        n, chunk = _numel(shapes), spec.chunk
        assert chunk is not None
        chunks = math.ceil(n / chunk)
        scale, off = _view(data, 0, chunks, torch.float32)
        q, _ = _view(data, off, n, torch.int8)
        out = torch.nn.functional.pad(q.to(torch.float32), (0, -n % chunk)).view(-1, chunk) * scale[:, None]
        return out.reshape(-1)[:n]

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.gen.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "rng" in state:
            self.gen.set_state(state["rng"])


class TopKCodec(Codec):
    """Top-k sparsification (Lin et al. 2018, DGC Sec. 3; Stich et al. 2018, top_k operator): the k = ceil(ratio n)
    elements of largest magnitude, as (index, value) pairs; the rest is dropped (kept by error feedback)."""

    name = "topk"

    def __init__(self, ratio: float) -> None:
        self.ratio = ratio

    def encode(self, flat: torch.Tensor, shapes: Shapes) -> Encoded:
        n = flat.numel()
        k = min(n, max(1, math.ceil(self.ratio * n))) if n else 0
        idx = torch.topk(flat.abs(), k, sorted=False).indices.to(torch.int32)
        idx, _ = torch.sort(idx)
        values = flat[idx.long()].to(torch.float32)
        return Encoded(torch.cat([_bytes(idx), _bytes(values)]), CodecSpec(name="topk", k=k))

    @staticmethod
    def expected_bytes(spec: CodecSpec, shapes: Shapes) -> int:
        assert spec.k is not None
        if spec.k > _numel(shapes):
            raise CodecError(f"topk keeps k={spec.k} of {_numel(shapes)} elements")
        return 8 * spec.k

    @staticmethod
    def decode_data(data: torch.Tensor, spec: CodecSpec, shapes: Shapes) -> torch.Tensor:
        n, k = _numel(shapes), spec.k or 0
        idx, off = _view(data, 0, k, torch.int32)
        values, _ = _view(data, off, k, torch.float32)
        if k and (int(idx.min()) < 0 or int(idx.max()) >= n):
            raise CodecError(f"topk index out of range [0, {n})")
        out = torch.zeros(n, dtype=torch.float32)
        out[idx.long()] = values
        return out


def powersgd_matrix(shape: tuple[int, ...], rank: int) -> tuple[int, int] | None:
    """(m, n) of the matrix view of an entry that rank-``rank`` PowerSGD compresses, None if it is sent whole:
    vectors and biases (Vogels et al. 2019, Sec. 3: 'we do not compress' them) and matrices for which the factors
    (m + n) r would not be smaller than m n."""
    if len(shape) < 2:
        return None
    m = shape[0]
    n = math.prod(shape[1:])
    if (m + n) * rank >= m * n:
        return None
    return m, n


def orthogonalise(p: torch.Tensor) -> torch.Tensor:
    """The orthonormal basis of P's columns (Vogels et al. 2019, Alg. 1 line 4; reduced QR, as torch's hook)."""
    q: torch.Tensor = torch.linalg.qr(p, mode="reduced").Q
    return q


class PowerSgdCodec(Codec):
    """Rank-r PowerSGD (Vogels et al. 2019, Alg. 1) on each matrix-shaped entry, one power iteration per call with
    the warm start Q of the last call: P = M Q, P^ = orthogonalise(P), Q = M^T P^, M ~ P^ Q^T. An entry of rank
    <= r is reconstructed exactly (P^ spans M's columns, so P^ P^T M = M)."""

    name = "powersgd"

    def __init__(self, rank: int, seed: int) -> None:
        self.rank, self.seed = rank, seed
        self.q: dict[int, torch.Tensor] = {}

    def _warm_q(self, i: int, n: int) -> torch.Tensor:
        q = self.q.get(i)
        if q is None or q.shape != (n, self.rank):
            # Alg. 1: Q initialised from an i.i.d. standard normal, the same on every worker (seeded).
            q = torch.randn(n, self.rank, generator=torch.Generator().manual_seed(self.seed * 1000003 + i))
        return q

    def encode(self, flat: torch.Tensor, shapes: Shapes) -> Encoded:
        parts: list[torch.Tensor] = []
        off = 0
        for i, shape in enumerate(shapes):
            size = math.prod(shape)
            piece = flat[off : off + size].to(torch.float32)
            off += size
            mn = powersgd_matrix(shape, self.rank)
            if mn is None:
                parts.append(_bytes(piece))
                continue
            m = piece.view(mn)
            p = orthogonalise(m @ self._warm_q(i, mn[1]))
            q = m.T @ p
            self.q[i] = q
            parts += [_bytes(p), _bytes(q)]
        return Encoded(torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8),
                       CodecSpec(name="powersgd", rank=self.rank))

    @staticmethod
    def expected_bytes(spec: CodecSpec, shapes: Shapes) -> int:
        assert spec.rank is not None
        total = 0
        for shape in shapes:
            mn = powersgd_matrix(shape, spec.rank)
            total += 4 * (math.prod(shape) if mn is None else (mn[0] + mn[1]) * spec.rank)
        return total

    @staticmethod
    def decode_data(data: torch.Tensor, spec: CodecSpec, shapes: Shapes) -> torch.Tensor:
        assert spec.rank is not None
        out: list[torch.Tensor] = []
        off = 0
        for shape in shapes:
            mn = powersgd_matrix(shape, spec.rank)
            if mn is None:
                piece, off = _view(data, off, math.prod(shape), torch.float32)
                out.append(piece)
                continue
            p, off = _view(data, off, mn[0] * spec.rank, torch.float32)
            q, off = _view(data, off, mn[1] * spec.rank, torch.float32)
            out.append((p.view(mn[0], spec.rank) @ q.view(mn[1], spec.rank).T).reshape(-1))
        return torch.cat(out) if out else torch.empty(0)

    def state_dict(self) -> dict[str, Any]:
        return {"q": {i: q.clone() for i, q in self.q.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.q = {int(i): q.clone() for i, q in state.get("q", {}).items()}


_CODECS: dict[str, type[Codec]] = {"fp16": Fp16Codec, "bf16": Bf16Codec, "int8": Int8Codec, "topk": TopKCodec,
                                   "powersgd": PowerSgdCodec}


def decode(data: torch.Tensor | bytes | memoryview, spec: CodecSpec, shapes: Shapes) -> torch.Tensor:
    """The fp32 vector of a received buffer; CodecError when its size does not follow from ``spec`` and ``shapes``
    (checked before anything is allocated from the buffer's content)."""
    if not isinstance(data, torch.Tensor):
        data = torch.frombuffer(bytearray(data), dtype=torch.uint8) if len(data) else torch.empty(0, dtype=torch.uint8)
    if data.dtype != torch.uint8:
        data = data.contiguous().view(torch.uint8)
    codec = _CODECS[spec.name]
    if spec.name == "int8" and spec.chunk is None or spec.name == "topk" and spec.k is None \
            or spec.name == "powersgd" and spec.rank is None:
        raise CodecError(f"codec {spec.name!r} needs its parameter in the body's codec spec")
    want = codec.expected_bytes(spec, shapes)
    if data.numel() != want:
        raise CodecError(f"{spec.name} payload of {data.numel()} bytes; the model's shapes and {spec} make {want}")
    return codec.decode_data(data.reshape(-1), spec, shapes)


class ErrorFeedback:
    """EF-SGD (Karimireddy et al. 2019, Alg. 2) around a codec: p = delta + e; send C(p); e = p - D(C(p)).
    The sum of what is applied tracks the sum of the true updates: they differ by the current residual only."""

    def __init__(self, codec: Codec) -> None:
        self.codec = codec
        self.residual: torch.Tensor | None = None

    def encode(self, flat: torch.Tensor, shapes: Shapes) -> Encoded:
        p = flat.to(torch.float32) if self.residual is None else flat.to(torch.float32) + self.residual
        enc = self.codec.encode(p, shapes)
        self.residual = p - decode(enc.data, enc.spec, shapes)
        return enc

    def state_dict(self) -> dict[str, Any]:
        return {"codec": self.codec.state_dict(), "residual": None if self.residual is None else self.residual.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.codec.load_state_dict(state.get("codec", {}))
        r = state.get("residual")
        self.residual = None if r is None else r.clone()


Compressor = Codec | ErrorFeedback


# ---- the registry's side: one policy per codec -------------------------------------------------------------


class Compression(Policy):
    """A codec as the run chooses it (``compression.push`` / ``compression.pull``)."""

    sections: ClassVar[tuple[str, ...]] = ("compression", "int8", "topk", "powersgd")
    # The codec compresses a whole model (a pull) as well as a change: a change-only codec would need the
    # server to keep every agent's copy of the model.
    compresses_models: ClassVar[bool] = True
    # Gradients compressed by this codec can be summed by an all-reduce (client/collective.py).
    all_reduce: ClassVar[bool] = True
    # Fraction of fp32's bytes, for messages and docs (an estimate for powersgd: the spec decides).
    wire_bytes_per_fp32: ClassVar[float] = 1.0

    @classmethod
    def make(cls, core: Core, **sections: Any) -> Codec | None:
        """The bare codec (None for 'none')."""
        return None

    @classmethod
    def build(cls, core: Core, *args: Any, compression: CompressionParams | None = None, **sections: Any) -> Any:
        codec = cls.make(core, **sections)
        if codec is None:
            return None
        return ErrorFeedback(codec) if compression is not None and compression.error_feedback else codec


@register("compression", "none", "fp32", "float32")
class NoCompression(Compression):
    """fp32 as it is."""


@register("compression", "fp16", "float16")
class Fp16(Compression):
    """IEEE half precision (DDP's fp16_compress_hook)."""

    wire_bytes_per_fp32 = 0.5

    @classmethod
    def make(cls, core: Core, **sections: Any) -> Codec:
        return Fp16Codec()


@register("compression", "bf16", "bfloat16")
class Bf16(Compression):
    """bfloat16: fp32's range, 8 bits of mantissa."""

    wire_bytes_per_fp32 = 0.5

    @classmethod
    def make(cls, core: Core, **sections: Any) -> Codec:
        return Bf16Codec()


@register("compression", "int8")
class Int8(Compression):
    """QSGD-style 8-bit quantisation with per-chunk scales and stochastic rounding (Alistarh et al. 2017)."""

    all_reduce = False
    wire_bytes_per_fp32 = 0.25

    @classmethod
    def make(cls, core: Core, *, int8: Int8Params | None = None, **sections: Any) -> Codec:
        p = int8 or Int8Params()
        return Int8Codec(p.chunk, p.stochastic, core.seed)


@register("compression", "topk")
class TopK(Compression):
    """Top-k sparsification (Lin et al. 2018; Stich et al. 2018)."""

    compresses_models = False
    all_reduce = False

    @classmethod
    def make(cls, core: Core, *, topk: TopKParams | None = None, **sections: Any) -> Codec:
        return TopKCodec((topk or TopKParams()).ratio)


@register("compression", "powersgd")
class PowerSgd(Compression):
    """Rank-r PowerSGD for matrix-shaped entries (Vogels et al. 2019, Alg. 1)."""

    compresses_models = False

    @classmethod
    def make(cls, core: Core, *, powersgd: PowerSgdParams | None = None, **sections: Any) -> Codec:
        return PowerSgdCodec((powersgd or PowerSgdParams()).rank, core.seed)


def check_choice(compression: CompressionParams, *, topology: str) -> None:
    """Refuse codec choices the run cannot carry out, with the reason (ValueError naming the field)."""
    push = get("compression", compression.push)
    pull = get("compression", compression.pull)
    assert issubclass(push, Compression) and issubclass(pull, Compression)
    if not pull.compresses_models:
        raise ValueError(f"compression.pull={pull.name!r} compresses changes, not models: the server would have to "
                         "keep every agent's copy of the model to send it the change; pull with none, fp16, bf16 "
                         "or int8")
    if topology == "collective" and not push.all_reduce:
        raise ValueError(f"compression.push={push.name!r} cannot be summed by an all-reduce (topology "
                         "'collective'): its indices or per-chunk scales differ between ranks and would need an "
                         "all-gather")
    if topology == "collective" and push.name == "powersgd":
        # PowerSGD can be all-reduced (P, then Q: DDP's powerSGD_hook), but client/collective.py sends fp16/bf16
        # only: refused rather than silently sending fp32.
        raise ValueError("compression.push='powersgd' under topology 'collective' is not built yet (the all-reduce "
                         "sends fp32, fp16 or bf16); use fp16/bf16 there, topology 'ps', or the DDP peer's "
                         "--ddp-hook powersgd")


def canonical_codec(name: str) -> str:
    return canonical("compression", name)
