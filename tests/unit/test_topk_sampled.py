"""Top-k's sampled selection (``topk.selection=sampled``, DGC's sampled threshold as a prefilter, Lin et al. 2018,
Sec. 3): the same k elements and bytes as ``torch.topk`` over every element, its fallback, ties, and error
feedback's in-place residual (bit for bit p - D(C(p)))."""

from __future__ import annotations

import math

import pytest
import torch

from hermes.common.codecs import ErrorFeedback, TopKCodec, decode
from hermes.common.config import ConfigError, build_config
from hermes.common.policies import base as policies

N = 200_003  # above TopKCodec.SAMPLED_MIN_N: the sampled path runs


def _layered(seed: int, n: int = N) -> torch.Tensor:
    """A change whose scale differs by layer, as a model's does, with heavy tails."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) ** 3
    cuts = sorted(torch.randint(0, n, (6,), generator=g).tolist())
    for i, (a, b) in enumerate(zip([0, *cuts], [*cuts, n], strict=True)):
        x[a:b] *= 10.0 ** (i - 3)
    return x


def _kept(codec: TopKCodec, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    enc = codec.encode(x, ((x.numel(),),))
    out = decode(enc.data, enc.spec, ((x.numel(),),))
    return enc.data, out != 0


@pytest.mark.parametrize("ratio", [0.001, 0.01, 0.05, 0.3])
@pytest.mark.parametrize("seed", [0, 1])
def test_sampled_keeps_exactly_the_k_largest_as_full_does(ratio: float, seed: int) -> None:
    x = _layered(seed)
    sampled, full = TopKCodec(ratio, "sampled"), TopKCodec(ratio, "full")
    data_s, kept = _kept(sampled, x)
    data_f, _ = _kept(full, x)
    k = math.ceil(ratio * N)
    assert int(kept.sum()) == k
    assert float(x[kept].abs().min()) >= float(x[~kept].abs().max())
    assert torch.equal(data_s, data_f)  # same indices (ascending), same values, same bytes
    assert sampled.fallbacks == 0  # the prefilter did the work (it is the path under test)


def test_when_the_sample_overestimates_the_threshold_the_full_path_runs() -> None:
    x = _layered(2)
    codec = TopKCodec(0.01, "sampled")
    codec.encode(x, ((N,),))
    assert codec.fallbacks == 0
    # A sample of only the largest elements sets the threshold above the k-th: fewer than k candidates.
    assert codec._positions is not None
    codec._positions = torch.topk(x.abs(), codec._positions.numel()).indices
    data, kept = _kept(codec, x)
    assert codec.fallbacks == 1
    assert int(kept.sum()) == math.ceil(0.01 * N)
    assert torch.equal(data, _kept(TopKCodec(0.01, "full"), x)[0])


def test_ties_at_the_kth_magnitude_still_keep_k_of_the_largest() -> None:
    x = torch.full((N,), 0.5)
    x[:1000] = torch.linspace(1.0, 2.0, 1000)  # 1,000 above; k = 2,001 takes 1,001 of the tied 0.5s
    x[1000::2] *= -1
    codec = TopKCodec(0.01, "sampled")
    _, kept = _kept(codec, x)
    k = math.ceil(0.01 * N)
    assert int(kept.sum()) == k and bool(kept[:1000].all())


def test_the_sample_is_the_same_every_call_so_a_run_repeats() -> None:
    a, b = TopKCodec(0.05, "sampled"), TopKCodec(0.05, "sampled")
    for seed in range(3):
        x = _layered(10 + seed)
        assert torch.equal(a.encode(x, ((N,),)).data, b.encode(x, ((N,),)).data)
    assert a._positions is not None and b._positions is not None and torch.equal(a._positions, b._positions)


@pytest.mark.parametrize("selection", ["sampled", "full"])
def test_error_feedback_residual_is_bit_for_bit_p_minus_the_decoded(selection: str) -> None:
    shapes = ((N,),)
    ef = ErrorFeedback(TopKCodec(0.02, selection))
    residual = None
    for t in range(4):
        u = _layered(20 + t)
        before = u.clone()
        p = u.clone() if residual is None else u + residual
        enc = ef.encode(u, shapes)
        assert torch.equal(u, before)  # the caller's change is not written into
        want = p - decode(enc.data, enc.spec, shapes)
        assert ef.residual is not None
        assert torch.equal(ef.residual, want) and torch.equal(ef.residual.signbit(), want.signbit())
        residual = want


def _core() -> policies.Core:
    return policies.Core(lr=0.1, batch_size=32, cycle_samples=128, shard_size=64, seed=3, sync="asp", barrier=False)


def test_selection_is_a_switch_in_the_topk_section() -> None:
    for sel in ("sampled", "full"):
        cfg = build_config("asp", **{"compression.push": "topk", "topk.selection": sel, "topk.sample": 0.02,
                                     "compression.error_feedback": False})
        codec = policies.build("compression", "topk", cfg.core, cfg.sections())
        assert isinstance(codec, TopKCodec) and codec.selection == sel and codec.sample == 0.02
    default = build_config("asp", **{"compression.push": "topk", "compression.error_feedback": False})
    codec = policies.build("compression", "topk", default.core, default.sections())
    assert isinstance(codec, TopKCodec) and codec.selection == "sampled"
    with pytest.raises(ConfigError):
        build_config("asp", **{"compression.push": "topk", "topk.selection": "guess"})
    with pytest.raises(ValueError, match="full or sampled"):
        TopKCodec(0.01, "guess")


@pytest.mark.parametrize("ratio", [0.01, 0.05])
@pytest.mark.parametrize("ties", [False, True])
def test_the_numpy_passes_pick_what_the_torch_passes_pick(ratio: float, ties: bool) -> None:
    """A CPU fp32 magnitude takes numpy's compare and nonzero; a tensor numpy cannot view (bf16, CUDA, one
    that needs grad) takes torch's (``TopKCodec._kept``): the same indices from the same magnitudes."""
    x = _layered(3).abs()
    if ties:
        x = (x * 4).round() / 4  # many equal magnitudes around the k-th
    codec = TopKCodec(ratio, "sampled")
    k = codec.k_of(N)
    via_numpy = codec.select(x, k)
    with torch.no_grad():
        via_torch = codec.select(x.clone().requires_grad_(True), k)
    assert via_numpy.dtype == via_torch.dtype == torch.int64
    assert torch.equal(via_numpy, via_torch)
    assert int(via_numpy.numel()) == k
    rest = torch.ones(N, dtype=torch.bool)
    rest[via_numpy] = False
    assert float(x[via_numpy].min()) >= float(x[rest].max())
