"""The codecs behind the ``compression`` policy (common/policies/compression.py): fp32 vectors to bytes and back.

Kept apart from the policy module because they need torch, and the run
config (which the server's CLI reads before it loads torch, to refuse a
mistake fast) needs only the policy's names and parameters. Layouts, papers
and the receiver's bounds are described in the policy module's docstring.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from hermes.common.codec_spec import CodecError, CodecSpec, Shapes

log = logging.getLogger(__name__)

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
    """``n`` elements of ``dtype`` at byte ``off`` of a uint8 buffer, read in place where they are aligned.

    Decoders only read these views (what they return is always new memory), so a read-only received frame is
    not copied: a clone per piece was a third of an int8 push's decode (issue 31). An unaligned piece is copied."""
    item = dtype.itemsize  # not an empty tensor's element_size(): a tensor built per piece (issue 31)
    size = n * item
    piece = data[off : off + size]
    if piece.data_ptr() % item or piece.storage_offset() % item or not piece.is_contiguous():
        piece = piece.clone()
    return piece.view(dtype), off + size


def _numel(shapes: Shapes) -> int:
    try:
        return _numel_of_tuple(shapes)
    except TypeError:  # a list: not hashable
        return sum(math.prod(s) for s in shapes)


@functools.lru_cache(maxsize=64)
def _numel_of_tuple(shapes: tuple[tuple[int, ...], ...]) -> int:
    # Cached: a run has one model's shapes, and every decode asks two or three times (issue 31).
    return sum(math.prod(s) for s in shapes)


class DenseScratch:
    """The zeroed fp32 vector a top-k push decodes into, reused while nothing else holds the last one.

    A top-k decode writes k of n elements; the other n - k must read 0. A fresh ``torch.zeros`` per push is a
    4 MB memset at 1M parameters (0.05-0.06 ms hot, a few percent of a top-k push's server CPU, issue 31); the k
    elements the last decode wrote are zeroed again instead. Only when that decode's result is gone (the fold
    applied it and no buffer, barrier or journal holds it: the memory's use count, as ``ModelState`` reuses
    snapshot buffers) is the vector reused; otherwise a new one is allocated. Same values as ``torch.zeros`` then the scatter, bit
    for bit (+0.0 everywhere else). Keeps one n-element fp32 vector from the first decode on. Thread-safe: big
    payloads are decoded in worker threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._alias: torch.Tensor | None = None  # the buffer's memory, never the tensor handed out
        self._written: torch.Tensor | None = None  # the indices the last decode wrote (its own copy)

    def zeros(self, n: int, idx: torch.Tensor) -> torch.Tensor:
        """An all-zero fp32 vector of ``n`` elements whose elements ``idx`` the caller will write."""
        with self._lock:
            alias, written = self._alias, self._written
            if alias is not None and alias.numel() == n and _unshared(alias):
                if written is not None and written.numel():
                    alias[written] = 0.0
                out = alias.view(-1)  # a tensor of its own over the same memory: the use count sees it
            else:
                out = torch.zeros(n, dtype=torch.float32)
                self._alias = out.detach()
            self._written = idx.clone()
            return out


def _unshared(buf: torch.Tensor) -> bool:
    """True when only ``buf`` (and the probe's storage object) hold its memory (as server/state.py's)."""
    use_count = getattr(torch._C, "_storage_Use_Count", None)
    return use_count is not None and bool(use_count(buf.untyped_storage()._cdata) <= 2)


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
        x = flat.detach().reshape(-1).to(torch.float32)  # a view when it is fp32 already
        n, chunk = x.numel(), self.chunk
        chunks, full = -(-n // chunk), n // chunk
        # Scales and codes are written straight into the message's buffer: no padded copy of the vector, no |x|
        # temporary, no concatenation (issue 31: a pull right after a push quantises the model on its path).
        data = torch.empty(4 * chunks + n, dtype=torch.uint8)
        scale = data[: 4 * chunks].view(torch.float32)
        body = x[: full * chunk].view(full, chunk)
        if full:
            # max |x| of each chunk from its max and min (aminmax along a row is 20x slower here, torch 2.13)
            torch.maximum(body.amin(dim=1).abs_(), body.amax(dim=1).abs_(), out=scale[:full])
        if n > full * chunk:
            scale[full] = x[full * chunk :].abs().amax()
        scale.div_(127.0)
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        y = torch.empty(n, dtype=torch.float32)
        torch.div(body, safe[:full, None], out=y[: full * chunk].view(full, chunk))
        if n > full * chunk:
            torch.div(x[full * chunk :], safe[full], out=y[full * chunk :])
        if self.stochastic:
            # floor(y + u), u ~ U[0, 1): E = y (QSGD Lemma 3.1's unbiasedness). As many draws as the padded
            # (chunks, chunk) layout has, element i taking draw i: the generator's stream is the layout's.
            y.add_(torch.rand(chunks * chunk, generator=self.gen)[:n]).floor_()
        else:
            y.round_()
        data[4 * chunks :].view(torch.int8).copy_(y.clamp_(-127, 127))
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
        # x_i = q_i * scale of its chunk, in one pass (the int8 -> fp32 cast happens inside the multiply): no fp32
        # copy of q, no padded temporary. Bit for bit what q.float() * scale gives.
        out = torch.empty(n, dtype=torch.float32)
        full = n // chunk
        if full:
            torch.mul(q[: full * chunk].view(full, chunk), scale[:full, None], out=out[: full * chunk].view(full, chunk))
        if n % chunk:
            torch.mul(q[full * chunk :], scale[full], out=out[full * chunk :])
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.gen.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "rng" in state:
            self.gen.set_state(state["rng"])


class TopKCodec(Codec):
    """Top-k sparsification (Lin et al. 2018, DGC Sec. 3; Stich et al. 2018, top_k operator): the k = ceil(ratio n)
    elements of largest magnitude, as (index, value) pairs in index order; the rest is dropped (kept by error
    feedback).

    ``selection``: how the k are found. ``"full"``: ``torch.topk`` over all n magnitudes (12-25 ms at n = 1.21M,
    one thread, issue 31: on an unshaped link that was the push's cost). ``"sampled"`` (the default, measured
    faster: docs/compression.md): DGC's sampling (Lin et al. 2018, Sec. 3, "sampling" the gradient to estimate
    the top-k threshold), used as a prefilter only: the threshold is set a few standard errors below the sample's
    estimate, every element at or above it is a candidate, and ``torch.topk`` runs on the candidates. When there
    are at least k of them they hold the global top k, so the elements sent are the exact top k (ties at the k-th
    magnitude aside, which neither path orders); when the estimate left fewer, the full path runs. DGC itself
    sends what the sampled threshold selects (about k, not k): not done here, so k and the bytes stay exact.
    The sample is the same ``sample``·n positions every call (drawn once from a fixed seed: no generator state,
    a run repeats)."""

    name = "topk"
    # Below this many elements the full topk is as fast as the sample's overhead.
    SAMPLED_MIN_N: ClassVar[int] = 65_536

    def __init__(self, ratio: float, selection: str = "sampled", sample: float = 0.01) -> None:
        if selection not in ("full", "sampled"):
            raise ValueError(f"topk selection {selection!r}: full or sampled")
        self.ratio, self.selection, self.sample = ratio, selection, sample
        self._positions: torch.Tensor | None = None  # the sampled positions, drawn for a vector of _n elements
        self._n = -1
        self.fallbacks = 0  # sampled calls whose prefilter kept fewer than k (the full path ran)

    def k_of(self, n: int) -> int:
        return min(n, max(1, math.ceil(self.ratio * n))) if n else 0

    def select(self, magnitude: torch.Tensor, k: int) -> torch.Tensor:
        """Indices (int64, ascending) of the k largest entries of ``magnitude``."""
        n = magnitude.numel()
        if self.selection == "sampled" and n >= self.SAMPLED_MIN_N and k < n:
            idx = self._sampled(magnitude, k)
            if idx is not None:
                return idx
            self.fallbacks += 1
        idx = torch.topk(magnitude, k, sorted=False).indices
        return torch.sort(idx).values

    def _sampled(self, magnitude: torch.Tensor, k: int) -> torch.Tensor | None:
        n = magnitude.numel()
        s = min(n, max(1024, math.ceil(self.sample * n)))
        positions = self._positions
        if positions is None or n != self._n:
            positions = torch.randperm(n, generator=torch.Generator().manual_seed(n))[:s]
            self._positions, self._n = positions, n
        # The sample's count above the true threshold is about binomial(s, k/n): ask for 3 standard deviations
        # (and one) more, so the prefilter keeps fewer than k about once in 700 calls.
        ks = k * s / n
        ks = min(s, math.ceil(ks + 3.0 * math.sqrt(ks) + 1.0))
        if ks >= s:
            return None
        threshold = torch.topk(magnitude[positions], ks, sorted=False).values.min()
        if magnitude.device.type != "cpu" or magnitude.dtype not in (torch.float32, torch.float64) \
                or magnitude.requires_grad:
            return self._kept(magnitude, torch.nonzero(magnitude >= threshold).view(-1), k)
        # The two passes over n through numpy: compare and nonzero 34 us against torch's 48 + 120 at n = 108,618,
        # the whole selection 132 against 318 us (one thread, 2026-11-28). Every agent pays it a push, times its
        # device's slowness (docs/compression.md, session 13). The same indices: float32 against a float32 scalar.
        mag = magnitude.numpy()
        candidates = np.flatnonzero(mag >= threshold.numpy())  # ascending, int64
        c = int(candidates.size)
        if c < k:
            return None
        if c == k:
            return torch.from_numpy(candidates)
        cm = mag[candidates]
        # The k-th largest candidate, then every candidate at or above it: ascending already, no sort.
        kth = torch.kthvalue(torch.from_numpy(cm), c - k + 1).values.numpy()
        kept = candidates[cm >= kth]
        if int(kept.size) == k:
            return torch.from_numpy(kept)
        # Ties at that magnitude would keep more than k: then the k by topk.
        chosen = torch.topk(torch.from_numpy(cm), k, sorted=False).indices
        return torch.from_numpy(candidates)[torch.sort(chosen).values]

    @staticmethod
    def _kept(magnitude: torch.Tensor, candidates: torch.Tensor, k: int) -> torch.Tensor | None:
        """``_sampled``'s last steps in torch (a tensor numpy cannot view): the k largest of the candidates,
        ascending."""
        c = int(candidates.numel())
        if c < k:
            return None
        if c == k:
            return candidates
        cm = magnitude[candidates]
        kept = candidates[cm >= torch.kthvalue(cm, c - k + 1).values]
        if int(kept.numel()) == k:
            return kept
        chosen = torch.topk(cm, k, sorted=False).indices
        return candidates[torch.sort(chosen).values]

    def encode(self, flat: torch.Tensor, shapes: Shapes) -> Encoded:
        k = self.k_of(flat.numel())
        idx = self.select(flat.abs(), k)
        values = flat[idx].to(torch.float32)
        return Encoded(torch.cat([_bytes(idx.to(torch.int32)), _bytes(values)]), CodecSpec(name="topk", k=k))

    def drop_sent(self, p: torch.Tensor, enc: Encoded) -> torch.Tensor:
        """EF's residual p - D(C(p)) in place on ``p`` (which the caller owns): the sent elements zeroed. Bit for
        bit the subtraction (x - x is +0.0, x - 0.0 is x), without decoding a dense vector."""
        k = enc.spec.k or 0
        idx, _ = _view(enc.data, 0, k, torch.int32)
        p[idx.long()] = 0.0
        return p

    @staticmethod
    def expected_bytes(spec: CodecSpec, shapes: Shapes) -> int:
        assert spec.k is not None
        if spec.k > _numel(shapes):
            raise CodecError(f"topk keeps k={spec.k} of {_numel(shapes)} elements")
        return 8 * spec.k

    @staticmethod
    def decode_data(data: torch.Tensor, spec: CodecSpec, shapes: Shapes,
                    scratch: DenseScratch | None = None) -> torch.Tensor:
        return TopKCodec.decode_values(data, spec, shapes, scratch)[0]

    @staticmethod
    def decode_values(data: torch.Tensor, spec: CodecSpec, shapes: Shapes,
                      scratch: DenseScratch | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The dense update and the k values it was written from (a view of ``data``: read them before it goes)."""
        n, k = _numel(shapes), spec.k or 0
        idx, off = _view(data, 0, k, torch.int32)
        values, _ = _view(data, off, k, torch.float32)
        if k:
            # Strictly increasing, as encode sends them: the first and last then bound them all, and no index
            # comes twice, so the update's norm is its k values' (decode_topk) and no write order decides
            # which of two values lands. Read through numpy: 3.8 us at k = 10,000 against torch's 14 (four small
            # ops' dispatch; issue 31, 2026-11-28), where a dense norm was 78 us.
            ids = idx.numpy()
            if ids[0] < 0 or ids[-1] >= n:
                raise CodecError(f"topk index out of range [0, {n})")
            if k > 1 and not (ids[1:] > ids[:-1]).all():
                raise CodecError("topk indices must be strictly increasing (each element sent once, in order)")
        out = torch.zeros(n, dtype=torch.float32) if scratch is None else scratch.zeros(n, idx)
        # int32 indices as they came: no int64 copy of them.
        out[idx] = values
        return out, values


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
        # Each entry is written into its place in the output (no per-entry temporaries, no cat of them).
        out = torch.empty(_numel(shapes), dtype=torch.float32)
        off = at = 0
        for shape in shapes:
            size = math.prod(shape)
            mn = powersgd_matrix(shape, spec.rank)
            if mn is None:
                piece, off = _view(data, off, size, torch.float32)
                out[at : at + size].copy_(piece)
            else:
                p, off = _view(data, off, mn[0] * spec.rank, torch.float32)
                q, off = _view(data, off, mn[1] * spec.rank, torch.float32)
                torch.mm(p.view(mn[0], spec.rank), q.view(mn[1], spec.rank).T, out=out[at : at + size].view(mn))
            at += size
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"q": {i: q.clone() for i, q in self.q.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.q = {int(i): q.clone() for i, q in state.get("q", {}).items()}


_CODECS: dict[str, type[Codec]] = {"fp16": Fp16Codec, "bf16": Bf16Codec, "int8": Int8Codec, "topk": TopKCodec,
                                   "powersgd": PowerSgdCodec}


def decode(data: torch.Tensor | bytes | memoryview, spec: CodecSpec, shapes: Shapes,
           scratch: DenseScratch | None = None) -> torch.Tensor:
    """The fp32 vector of a received buffer; CodecError when its size does not follow from ``spec`` and ``shapes``
    (checked before anything is allocated from the buffer's content). ``scratch``: a top-k decode's zeroed
    vector, reused (``DenseScratch``)."""
    codec, data = _checked(data, spec, shapes)
    if scratch is not None and codec is TopKCodec:
        return TopKCodec.decode_data(data, spec, shapes, scratch)
    return codec.decode_data(data, spec, shapes)


def decode_topk(data: torch.Tensor | bytes | memoryview, spec: CodecSpec, shapes: Shapes,
                scratch: DenseScratch | None = None) -> tuple[torch.Tensor, float]:
    """``decode`` of a top-k payload and its squared L2 norm from the k values it read, without reading the dense
    vector: the other n - k elements are zeros and the decode refuses an index sent twice. The same sum as over the
    dense vector, in another order (fp32 dot either way); one view of the values, not a second one (on a push's
    cold caches each torch call counts, issue 31)."""
    if spec.name != "topk":
        raise CodecError(f"decode_topk of a {spec.name!r} payload")
    _, data = _checked(data, spec, shapes)
    out, values = TopKCodec.decode_values(data, spec, shapes, scratch)
    return out, float(torch.dot(values, values))


def _checked(data: torch.Tensor | bytes | memoryview, spec: CodecSpec, shapes: Shapes) -> tuple[type[Codec], torch.Tensor]:
    """The codec of ``spec`` and ``data`` as a flat uint8 tensor whose size follows from ``spec`` and ``shapes``."""
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
    return codec, data.reshape(-1)


class ErrorFeedback:
    """EF-SGD (Karimireddy et al. 2019, Alg. 2) around a codec: p = delta + e; send C(p); e = p - D(C(p)).
    The sum of what is applied tracks the sum of the true updates: they differ by the current residual only."""

    def __init__(self, codec: Codec) -> None:
        self.codec = codec
        self.residual: torch.Tensor | None = None

    def encode(self, flat: torch.Tensor, shapes: Shapes) -> Encoded:
        if self.residual is None:
            p = flat.to(torch.float32, copy=True)  # ours: top-k's residual is written into it
        else:
            p = flat.to(torch.float32) + self.residual
        enc = self.codec.encode(p, shapes)
        if isinstance(self.codec, TopKCodec):
            self.residual = self.codec.drop_sent(p, enc)
        else:
            self.residual = p - decode(enc.data, enc.spec, shapes)
        return enc

    def state_dict(self) -> dict[str, Any]:
        return {"codec": self.codec.state_dict(), "residual": None if self.residual is None else self.residual.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.codec.load_state_dict(state.get("codec", {}))
        r = state.get("residual")
        self.residual = None if r is None else r.clone()


Compressor = Codec | ErrorFeedback


