"""The codecs' fast paths (issue 31's micro) give the bytes and vectors of the plain formulas they replaced: int8
written into the message buffer (no padded copy), decoders reading the received buffer in place (and copying only
an unaligned piece), PowerSGD writing each entry into the output."""

from __future__ import annotations

import math

import pytest
import torch

from hermes.common.codec_spec import CodecError, CodecSpec
from hermes.common.codecs import Int8Codec, PowerSgdCodec, TopKCodec, decode, decode_topk, powersgd_matrix


def plain_int8(x: torch.Tensor, chunk: int, gen: torch.Generator | None) -> torch.Tensor:
    """QSGD with s = 127 and a chunk's max |x| as its norm (Alistarh et al. 2017, Sec. 3.1), as first written:
    padded to whole chunks, scales then codes."""
    n = x.numel()
    xp = torch.nn.functional.pad(x, (0, -n % chunk)).view(-1, chunk)
    scale = xp.abs().amax(dim=1) / 127.0
    y = xp / torch.where(scale > 0, scale, torch.ones_like(scale))[:, None]
    y = torch.floor(y + torch.rand(y.shape, generator=gen)) if gen is not None else torch.round(y)
    q = y.clamp_(-127, 127).to(torch.int8).reshape(-1)[:n]
    return torch.cat([scale.view(torch.uint8), q.view(torch.uint8)])


def unaligned(data: torch.Tensor) -> torch.Tensor:
    """The same bytes one byte off an aligned address, as a received frame may be."""
    buf = torch.zeros(data.numel() + 1, dtype=torch.uint8)
    buf[1:] = data
    return buf[1:]


@pytest.mark.parametrize("n", [0, 1, 16, 1000, 1024, 4099])
@pytest.mark.parametrize("stochastic", [False, True])
def test_int8_bytes_and_values_are_the_plain_formulas(n: int, stochastic: bool) -> None:
    x = torch.randn(n, generator=torch.Generator().manual_seed(n)) * 3
    if n >= 1024:
        x[16:48] = 0.0  # an all-zero chunk: scale 0, codes 0
    codec = Int8Codec(16, stochastic, seed=7)
    reference_gen = torch.Generator().manual_seed(7) if stochastic else None
    for _ in range(2):  # the generator's stream stays the plain layout's across calls
        data = codec.encode(x, ((n,),)).data
        assert torch.equal(data, plain_int8(x, 16, reference_gen))
    spec = CodecSpec(name="int8", chunk=16)
    chunks = -(-n // 16)
    scale = data[: 4 * chunks].clone().view(torch.float32)
    q = data[4 * chunks :].clone().view(torch.int8).float()
    expected = (torch.nn.functional.pad(q, (0, -n % 16)).view(-1, 16) * scale[:, None]).reshape(-1)[:n]
    assert torch.equal(decode(data, spec, ((n,),)), expected)
    assert torch.equal(decode(unaligned(data), spec, ((n,),)), expected)


def test_topk_and_powersgd_decode_in_place_and_unaligned() -> None:
    shapes = ((30, 20), (30,), (9, 30), (9,), (2, 3, 4, 4))
    n = sum(math.prod(s) for s in shapes)
    x = torch.randn(n, generator=torch.Generator().manual_seed(1))
    enc = TopKCodec(0.1).encode(x, shapes)
    k = enc.spec.k
    assert k is not None
    idx = enc.data[: 4 * k].clone().view(torch.int32).long()
    dense = torch.zeros(n)
    dense[idx] = enc.data[4 * k :].clone().view(torch.float32)
    assert torch.equal(decode(enc.data, enc.spec, shapes), dense)
    assert torch.equal(decode(unaligned(enc.data), enc.spec, shapes), dense)

    enc = PowerSgdCodec(2, 0).encode(x, shapes)
    floats, parts, off = enc.data.clone().view(torch.float32), [], 0
    for shape in shapes:
        mn = powersgd_matrix(shape, 2)
        if mn is None:
            parts.append(floats[off : off + math.prod(shape)])
            off += math.prod(shape)
            continue
        p = floats[off : off + 2 * mn[0]].view(mn[0], 2)
        q = floats[off + 2 * mn[0] : off + 2 * (mn[0] + mn[1])].view(mn[1], 2)
        off += 2 * (mn[0] + mn[1])
        parts.append((p @ q.T).reshape(-1))
    assert torch.equal(decode(enc.data, enc.spec, shapes), torch.cat(parts))
    assert torch.equal(decode(unaligned(enc.data), enc.spec, shapes), torch.cat(parts))


def test_decoded_vectors_do_not_alias_the_received_buffer() -> None:
    """The dense update is folded and journaled after the frame is gone: it must be memory of its own."""
    shapes = ((40,),)
    x = torch.randn(40, generator=torch.Generator().manual_seed(2))
    for codec in (Int8Codec(16, False, 0), TopKCodec(0.5), PowerSgdCodec(1, 0)):
        enc = codec.encode(x, shapes)
        out = decode(enc.data, enc.spec, shapes)
        before = out.clone()
        enc.data.fill_(0)
        assert torch.equal(out, before)


def test_topk_decode_into_a_reused_zero_vector_is_bit_for_bit_a_fresh_one() -> None:
    """DenseScratch: the k elements the last decode wrote are zeroed again instead of a new zero vector a push;
    every decode equals torch.zeros + the scatter, bit for bit (-0.0 included)."""
    from hermes.common.codecs import DenseScratch

    scratch, shapes, gen = DenseScratch(), ((50, 20), (40,)), torch.Generator().manual_seed(3)
    first = None
    for i in range(6):
        delta = torch.randn(1040, generator=gen)
        delta[7] = -0.0 if i % 2 else delta[7]
        enc = TopKCodec(0.05).encode(delta, shapes)
        got = decode(enc.data, enc.spec, shapes, scratch)
        want = decode(enc.data, enc.spec, shapes)
        assert torch.equal(got.view(torch.int32), want.view(torch.int32))
        if first is None:
            first = got.data_ptr()
        else:
            assert got.data_ptr() == first  # the last result was dropped: its memory is reused
        del got


@pytest.mark.parametrize("indices", [[5, 9, 5, 1000], [5, 9, 9, 1000], [9, 5, 7, 1000], [0, 0]])
def test_topk_indices_out_of_order_or_repeated_are_refused_and_the_scratch_stays_right(indices: list[int]) -> None:
    """A sender's repeated or unordered indices are one CodecError (encode sends each once, ascending), with or
    without the reused vector; the next good decode is still bit for bit a fresh one."""
    from hermes.common.codecs import DenseScratch

    scratch, shapes = DenseScratch(), ((50, 20), (40,))
    idx = torch.tensor(indices, dtype=torch.int32)
    data = torch.cat([idx.view(torch.uint8), torch.ones(len(indices)).view(torch.uint8)])
    spec = CodecSpec(name="topk", k=len(indices))
    for s in (scratch, None):
        with pytest.raises(CodecError, match="strictly increasing"):
            decode(data, spec, shapes, s)
    enc = TopKCodec(0.05).encode(torch.randn(1040, generator=torch.Generator().manual_seed(4)), shapes)
    assert torch.equal(decode(enc.data, enc.spec, shapes, scratch), decode(enc.data, enc.spec, shapes))


def test_topk_norm_from_the_k_values_is_the_decoded_updates_squared_norm() -> None:
    """The server's norm of a top-k push read from its k values: the dense vector's, to fp32 rounding; inf and nan
    values make it non-finite as a dense pass would."""
    shapes = ((300, 20), (7,))
    for seed in range(5):
        enc = TopKCodec(0.01).encode(torch.randn(6007, generator=torch.Generator().manual_seed(seed)) * 10.0**seed,
                                     shapes)
        dense = decode(enc.data, enc.spec, shapes)
        assert decode_topk(enc.data, enc.spec, shapes)[1] == pytest.approx(float(torch.dot(dense, dense)),
                                                                              rel=1e-6)
    for bad in (math.inf, math.nan):
        delta = torch.zeros(6007)
        delta[11] = bad
        enc = TopKCodec(0.01).encode(delta, shapes)
        assert not math.isfinite(decode_topk(enc.data, enc.spec, shapes)[1])


def test_topk_scratch_never_writes_a_vector_someone_still_holds() -> None:
    from hermes.common.codecs import DenseScratch

    scratch, shapes = DenseScratch(), ((100,),)
    a_enc = TopKCodec(0.1).encode(torch.arange(100.0), shapes)
    b_enc = TopKCodec(0.1).encode(-torch.arange(100.0), shapes)
    held = decode(a_enc.data, a_enc.spec, shapes, scratch)
    kept = held.clone()
    view = held[10:]  # a view holds the memory too (as a buffered update's chunk would)
    del held
    other = decode(b_enc.data, b_enc.spec, shapes, scratch)
    assert other.data_ptr() != view.data_ptr() - 40
    assert torch.equal(view, kept[10:])
    assert torch.equal(other, decode(b_enc.data, b_enc.spec, shapes))
    # Both let go: the newer vector is the one reused, and it reads zeros outside the new indices.
    del view, other
    again = decode(a_enc.data, a_enc.spec, shapes, scratch)
    assert torch.equal(again, kept)


def test_a_topk_push_reaches_screening_with_its_dense_norm_and_a_disordered_one_is_refused() -> None:
    """The server's decompressed top-k push carries the norm of its dense update (read from the k values) and the
    same bits as a plain decode; a push whose indices repeat is refused as a bad shape, one line."""
    from hermes.common.tensors import ModelSpec
    from hermes.common.wire import ErrorCode, Payload, ProtocolError
    from hermes.server.engine.handlers import decompressed

    spec = ModelSpec(name="m", entries=(("w", (300, 20)), ("b", (7,))))
    enc = TopKCodec(0.01).encode(torch.randn(6007, generator=torch.Generator().manual_seed(1)), spec.shapes)
    sent = Payload(dtype=torch.uint8, chunks=(enc.data,), shapes=((enc.data.numel(),),))
    got = decompressed(spec, sent, enc.spec)
    dense = decode(enc.data, enc.spec, spec.shapes)
    assert torch.equal(got.flat(), dense)
    assert got.norm == pytest.approx(math.sqrt(float(torch.dot(dense, dense))), rel=1e-6)
    idx = torch.tensor([3, 3], dtype=torch.int32)
    bad = torch.cat([idx.view(torch.uint8), torch.ones(2).view(torch.uint8)])
    with pytest.raises(ProtocolError, match="strictly increasing") as exc:
        decompressed(spec, Payload(dtype=torch.uint8, chunks=(bad,), shapes=((16,),)), CodecSpec(name="topk", k=2))
    assert exc.value.code == ErrorCode.BAD_SHAPE


def test_decode_topk_gives_decodes_vector_and_the_sum_of_squares_of_its_values() -> None:
    """The push handler's one call: the same dense vector as ``decode`` (with and without the reused zero vector)
    and exactly the fp32 dot of the k values sent; refusals as ``decode``'s."""
    from hermes.common.codecs import DenseScratch

    shapes, scratch = ((300, 20), (7,)), DenseScratch()
    for seed in range(3):
        enc = TopKCodec(0.02).encode(torch.randn(6007, generator=torch.Generator().manual_seed(seed)), shapes)
        for s in (None, scratch):
            flat, ss = decode_topk(enc.data, enc.spec, shapes, s)
            assert torch.equal(flat, decode(enc.data, enc.spec, shapes))
            values = TopKCodec.decode_values(enc.data, enc.spec, shapes)[1]  # the k values, viewed where they lie
            assert ss == float(torch.dot(values, values))
            del flat
    with pytest.raises(CodecError, match="make"):
        decode_topk(enc.data[:-4], enc.spec, shapes)
    with pytest.raises(CodecError, match="decode_topk of a 'int8'"):
        decode_topk(enc.data, CodecSpec(name="int8", chunk=64), shapes)
