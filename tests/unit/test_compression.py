"""The compression codecs (common/policies/compression.py): each one's defining property, error feedback, the
receiver's bounds, state round trips and the run config's choices."""

from __future__ import annotations

import math

import pytest
import torch

from hermes.common.codecs import ErrorFeedback, Int8Codec, PowerSgdCodec, TopKCodec, decode, powersgd_matrix
from hermes.common.config import ConfigError, build_config
from hermes.common.policies import base as policies
from hermes.common.policies.compression import CodecError, CodecSpec

SHAPES = ((32, 16), (32,), (10, 8, 3, 3), (10,))


def _vec(seed: int = 0, shapes: tuple[tuple[int, ...], ...] = SHAPES) -> torch.Tensor:
    return torch.randn(sum(math.prod(s) for s in shapes), generator=torch.Generator().manual_seed(seed))


def _core() -> policies.Core:
    return policies.Core(lr=0.1, batch_size=32, cycle_samples=128, shard_size=64, seed=3, sync="asp", barrier=False)


def test_topk_keeps_exactly_the_k_largest() -> None:
    x = _vec(1)
    enc = TopKCodec(0.05).encode(x, SHAPES)
    k = math.ceil(0.05 * x.numel())
    assert enc.spec.k == k and enc.nbytes == 8 * k
    out = decode(enc.data, enc.spec, SHAPES)
    kept = out != 0
    assert int(kept.sum()) == k
    assert torch.equal(out[kept], x[kept])  # values exact
    # Every kept magnitude is at least every dropped one.
    assert float(x[kept].abs().min()) >= float(x[~kept].abs().max())


@pytest.mark.parametrize("stochastic", [True, False])
def test_int8_error_within_its_bound(stochastic: bool) -> None:
    x = _vec(2) * 3
    chunk = 64
    codec = Int8Codec(chunk, stochastic, seed=0)
    enc = codec.encode(x, SHAPES)
    n = x.numel()
    assert enc.nbytes == n + 4 * math.ceil(n / chunk)
    out = decode(enc.data, enc.spec, SHAPES)
    pad = -n % chunk
    step = torch.nn.functional.pad(x.abs(), (0, pad)).view(-1, chunk).amax(1) / 127
    bound = step.repeat_interleave(chunk)[:n] * (1.0 if stochastic else 0.5)
    err = (out - x).abs()
    assert bool((err <= bound * (1 + 1e-5) + 1e-7).all())
    assert float(err.max()) > 0  # it did quantise


def test_int8_stochastic_rounding_is_unbiased() -> None:
    x = torch.full((4096,), 0.3)
    x[0] = 1.0  # the scale: one step is 1/127, and 0.3 lies between two levels
    codec = Int8Codec(4096, True, seed=0)
    mean = torch.stack([decode(codec.encode(x, ((4096,),)).data, CodecSpec(name="int8", chunk=4096), ((4096,),))
                        for _ in range(50)]).mean()
    nearest = decode(Int8Codec(4096, False, 0).encode(x, ((4096,),)).data, CodecSpec(name="int8", chunk=4096),
                     ((4096,),)).mean()
    target = x.mean()
    assert abs(float(mean - target)) < abs(float(nearest - target)) / 5


def test_powersgd_reconstructs_a_low_rank_matrix_exactly_at_its_rank() -> None:
    g = torch.Generator().manual_seed(4)
    m = torch.randn(40, 3, generator=g) @ torch.randn(3, 50, generator=g)  # rank 3
    bias = torch.randn(40, generator=g)
    shapes = ((40, 50), (40,))
    flat = torch.cat([m.reshape(-1), bias])
    enc = PowerSgdCodec(3, seed=0).encode(flat, shapes)
    assert enc.nbytes == 4 * ((40 + 50) * 3 + 40)
    out = decode(enc.data, enc.spec, shapes)
    assert torch.allclose(out[:2000], m.reshape(-1), atol=1e-4)
    assert torch.equal(out[2000:], bias)  # vectors travel whole
    # At a lower rank it cannot.
    low = decode(*(lambda e: (e.data, e.spec))(PowerSgdCodec(2, seed=0).encode(flat, shapes)), shapes)
    assert not torch.allclose(low[:2000], m.reshape(-1), atol=1e-2)


def test_powersgd_sends_small_and_vector_entries_whole() -> None:
    assert powersgd_matrix((32,), 4) is None
    assert powersgd_matrix((4, 4), 4) is None  # factors no smaller than the matrix
    assert powersgd_matrix((10, 8, 3, 3), 2) == (10, 72)


@pytest.mark.parametrize("make", [lambda: TopKCodec(0.02), lambda: PowerSgdCodec(1, 0), lambda: Int8Codec(64, True, 0)],
                         ids=["topk", "powersgd", "int8"])
def test_with_error_feedback_the_applied_sum_tracks_the_true_sum(make) -> None:  # type: ignore[no-untyped-def]
    ef, plain = ErrorFeedback(make()), make()
    true = torch.zeros(_vec().numel())
    applied = torch.zeros_like(true)
    applied_plain = torch.zeros_like(true)
    for t in range(60):
        u = _vec(100 + t) * 0.1 + 0.05  # a steady direction plus noise, as gradients have
        true += u
        e = ef.encode(u, SHAPES)
        applied += decode(e.data, e.spec, SHAPES)
        p = plain.encode(u, SHAPES)
        applied_plain += decode(p.data, p.spec, SHAPES)
        # EF-SGD: the sums differ by exactly the residual kept on the sender.
        assert ef.residual is not None
        assert torch.allclose(true - applied, ef.residual, atol=1e-3)
    gap_ef = float((true - applied).norm() / true.norm())
    gap_plain = float((true - applied_plain).norm() / true.norm())
    assert gap_ef < gap_plain


def test_state_dict_resumes_exactly() -> None:
    for make in (lambda: ErrorFeedback(PowerSgdCodec(2, 0)), lambda: ErrorFeedback(Int8Codec(64, True, 0))):
        a = make()
        for t in range(3):
            a.encode(_vec(t), SHAPES)
        b = make()
        b.load_state_dict(a.state_dict())
        x = _vec(9)
        assert torch.equal(a.encode(x, SHAPES).data, b.encode(x, SHAPES).data)
        assert a.residual is not None and b.residual is not None and torch.equal(a.residual, b.residual)


@pytest.mark.parametrize("spec,nbytes", [
    (CodecSpec(name="topk", k=3), 23),
    (CodecSpec(name="topk", k=10_000), 80_000),
    (CodecSpec(name="int8", chunk=64), 5),
    (CodecSpec(name="powersgd", rank=2), 7),
    (CodecSpec(name="fp16"), 3),
])
def test_a_buffer_that_does_not_match_its_spec_is_refused(spec: CodecSpec, nbytes: int) -> None:
    with pytest.raises(CodecError):
        decode(torch.zeros(nbytes, dtype=torch.uint8), spec, SHAPES)


def test_topk_indices_out_of_range_are_refused() -> None:
    data = torch.cat([torch.tensor([0, 99999], dtype=torch.int32).view(torch.uint8),
                      torch.ones(2).view(torch.uint8)])
    with pytest.raises(CodecError, match="out of range"):
        decode(data, CodecSpec(name="topk", k=2), SHAPES)


@pytest.mark.parametrize("name,ratio", [("fp16", 0.5), ("bf16", 0.5), ("int8", 0.26), ("topk", 0.125),
                                        ("powersgd", 0.5)])
def test_registry_builds_each_codec_from_its_sections(name: str, ratio: float) -> None:
    cfg = build_config("asp", **{"compression.push": name, "topk.ratio": 1 / 16, "int8.chunk": 256,
                                 "powersgd.rank": 1})
    codec = policies.build("compression", cfg.compression.push, cfg.core, cfg.sections())
    assert isinstance(codec, ErrorFeedback)
    shapes = ((64, 64), (64,))
    x = _vec(5, shapes)
    enc = codec.encode(x, shapes)
    assert enc.nbytes <= ratio * 4 * x.numel()
    assert policies.build("compression", "none", cfg.core, cfg.sections()) is None


def test_error_feedback_switch() -> None:
    cfg = build_config("asp", **{"compression.push": "topk", "compression.error_feedback": False})
    assert isinstance(policies.build("compression", "topk", cfg.core, cfg.sections()), TopKCodec)


def test_refusals_name_the_reason() -> None:
    with pytest.raises(ConfigError, match="compresses changes, not models"):
        build_config("asp", **{"compression.pull": "powersgd"})
    with pytest.raises(ConfigError, match="all-gather"):
        build_config("bsp", topology="collective", **{"compression.push": "topk", "collective.world_size": 2})
    with pytest.raises(ConfigError, match="not built yet"):
        build_config("bsp", topology="collective", **{"compression.push": "powersgd", "collective.world_size": 2})
    build_config("bsp", topology="collective", **{"compression.push": "fp16", "collective.world_size": 2})
    with pytest.raises(ConfigError, match="disagree"):
        build_config("asp", pull_dtype="float16", **{"compression.pull": "int8"})
    with pytest.raises(ConfigError, match="unknown compression"):
        build_config("asp", **{"compression.push": "zip"})
    assert build_config("asp", pull_dtype="bfloat16").pull_codec == "bf16"
    assert build_config("asp", **{"compression.pull": "fp16"}).pull_codec == "fp16"
