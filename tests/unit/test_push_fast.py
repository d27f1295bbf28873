"""The push path's fused check-and-add (issue 17) and the snapshot buffer pool.

A half-precision update is widened to fp32 once, by validation's norm, and the
fold adds that copy; the checks it replaced must still hold: non-finite
updates refused, the fold's arithmetic exact, rollback intact, no copy kept
while an update waits. Snapshot buffers of earlier versions are reused only
when nothing holds their memory.
"""

from __future__ import annotations

import math

import pytest
import torch

import hermes.common.wire as wire
from hermes.common.tensors import ModelSpec
from hermes.common.wire import ErrorCode, Payload, ProtocolError
from hermes.server.state import ModelState, validate_update

SPEC = ModelSpec(name="toy", input_shape=(4,), entries=(("w", (40, 25)), ("b", (24,))))
N = SPEC.numel  # 1024
HALF = (torch.float16, torch.bfloat16)


def payload(flat: torch.Tensor, frames: int = 1) -> Payload:
    chunks = tuple(c.contiguous() for c in torch.tensor_split(flat, frames)) if frames > 1 else (flat,)
    return Payload(dtype=flat.dtype, chunks=chunks, shapes=SPEC.shapes)


def delta(dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    return torch.randn(N, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, *HALF])
@pytest.mark.parametrize("frames", [1, 3])
def test_norm_matches_an_exact_reference(dtype, frames):
    d = delta(dtype)
    p = payload(d, frames)
    exact = float(torch.linalg.vector_norm(d.double()))
    assert p.norm == pytest.approx(exact, rel=1e-5)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("frames", [1, 3])
def test_half_update_is_widened_once_and_the_fold_adds_that_copy(dtype, frames):
    d = delta(dtype)
    p = payload(d, frames)
    validate_update(SPEC, p)
    assert p.widened is not None and sum(w.numel() for w in p.widened) == N
    assert all(w.dtype == torch.float32 for w in p.widened)
    st = ModelState(SPEC, torch.ones(N))
    st.apply([(p, 0.5)])
    assert torch.equal(st.snapshot()[1], torch.ones(N) + 0.5 * d.float())
    assert "widened" not in p.__dict__  # the fold dropped the copy


@pytest.mark.parametrize("dtype", HALF)
def test_fold_after_release_widens_again_and_is_exact(dtype):
    d = delta(dtype)
    p = payload(d, 2)
    validate_update(SPEC, p)
    p.release_widened()  # what the engine does while an update waits for a release
    assert "widened" not in p.__dict__
    st = ModelState(SPEC, torch.zeros(N))
    st.apply([(p, 1.0), (payload(d), 2.0)])
    assert torch.equal(st.snapshot()[1], 3.0 * d.float())


@pytest.mark.parametrize("dtype", HALF)
def test_large_half_update_is_widened_block_by_block(dtype, monkeypatch):
    monkeypatch.setattr(wire, "WIDEN_MAX_NUMEL", N - 1)
    monkeypatch.setattr(wire, "NORM_BLOCK", 100)  # several blocks per chunk
    d = delta(dtype)
    p = payload(d, 2)
    assert p.widened is None
    assert p.norm == pytest.approx(float(torch.linalg.vector_norm(d.double())), rel=1e-5)
    st = ModelState(SPEC, torch.zeros(N))
    st.apply([(p, 1.0)])
    assert torch.equal(st.snapshot()[1], d.float())


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("frames", [1, 4])
def test_non_finite_half_update_is_still_refused(value, dtype, frames):
    d = delta(dtype)
    d[N - 7] = value
    p = payload(d, frames)
    with pytest.raises(ProtocolError) as ei:
        validate_update(SPEC, p)
    assert ei.value.code is ErrorCode.NON_FINITE
    assert p.norm == math.inf


def test_half_update_that_overflows_the_model_is_rolled_back():
    st = ModelState(SPEC, torch.ones(N))
    good_version, good = st.snapshot()
    good = good.clone()
    huge = torch.zeros(N, dtype=torch.bfloat16)
    huge[5] = 3e38  # bf16 holds it; its norm overflows, so the fold is checked
    st.apply([(payload(huge), 1.0)])
    st.apply([(payload(huge), 1.0)])  # 6e38: Inf in fp32
    assert st.rollbacks and st.rollbacks[-1][1] == good_version
    assert torch.equal(st.snapshot()[1], good)


# ---------------------------------------------------------------------------
# snapshot buffer pool


def test_a_snapshot_someone_holds_is_never_overwritten():
    st = ModelState(SPEC, torch.zeros(N))
    held = []
    for _ in range(8):
        version, flat = st.snapshot()
        held.append((version, flat))
        st.apply([(payload(torch.ones(N)), 1.0)])
    for version, flat in held:
        assert torch.equal(flat, torch.full((N,), float(version)))
    assert len({flat.data_ptr() for _, flat in held}) == len(held)


def test_frames_in_flight_keep_a_snapshot_buffer_from_reuse():
    st = ModelState(SPEC, torch.zeros(N))
    _, prepared = st.prepared(torch.float16)
    frames = prepared.frames  # as a send in progress holds them
    addr = prepared.tensor.data_ptr()
    del prepared
    for _ in range(4):
        st.apply([(payload(torch.ones(N)), 1.0)])
        _, p = st.prepared(torch.float16)
        assert p.tensor.data_ptr() != addr
        del p
    assert bytes(frames[0]) == torch.zeros(N, dtype=torch.float16).numpy().tobytes()


def test_released_snapshot_buffers_are_reused(monkeypatch):
    st = ModelState(SPEC, torch.zeros(N))
    reused: list[bool] = []

    def spy(dtype):
        buf = spare(dtype)
        reused.append(buf is not None)  # not the buffer itself: holding it would keep it from reuse
        return buf

    spare = st._spare
    monkeypatch.setattr(st, "_spare", spy)
    for _ in range(6):
        st.apply([(payload(torch.ones(N)), 1.0)])
        version, p = st.prepared(torch.float32)
        assert torch.equal(p.tensor, torch.full((N,), float(version)))
        del p
    # The first snapshots are fresh; from then on a retired, unshared one is copied into.
    assert sum(reused) >= 4


def test_every_write_after_a_snapshot_leaves_the_snapshot_alone():
    """fp32 snapshots are the model itself: a group fold, a blend and a load each write elsewhere."""
    st = ModelState(SPEC, torch.ones(N))
    d = delta(torch.float32)
    _, before_group = st.snapshot()
    st.apply([(payload(d), 1.0), (payload(d, 3), -2.0)])
    assert torch.equal(before_group, torch.ones(N))
    assert torch.equal(st.snapshot()[1], (torch.ones(N) + d) - 2.0 * d)  # the two adds, in order
    _, before_blend = st.snapshot()
    st.blend(payload(torch.zeros(N)), 0.5)  # halfway back to w0 = ones
    assert torch.equal(before_blend, (torch.ones(N) + d) - 2.0 * d)
    assert torch.allclose(st.snapshot()[1], torch.ones(N) - 0.5 * d, atol=1e-6)
    _, before_load = st.snapshot()
    st.load(torch.full((N,), 7.0), version=42)
    assert torch.allclose(before_load, torch.ones(N) - 0.5 * d, atol=1e-6)
    assert st.snapshot()[0] == 42 and torch.equal(st.snapshot()[1], torch.full((N,), 7.0))
