"""The global model: exact fp32 axpy, versions, snapshots, thread safety, update validation."""

from __future__ import annotations

import math
import threading

import pytest
import torch

from hermes.common.tensors import ModelSpec
from hermes.common.wire import (
    ErrorCode,
    Header,
    MsgType,
    Payload,
    ProtocolError,
    decode,
    encode,
)
from hermes.server.state import ModelState, validate_update

SPEC = ModelSpec(
    name="toy", input_shape=(4,),
    entries=(("w", (3, 4)), ("b", (3,)), ("scale", (2, 2, 2))),
)
N = SPEC.numel  # 12 + 3 + 8 = 23


def payload(flat: torch.Tensor, *, frames: int = 1, shapes=None) -> Payload:
    """A payload of ``flat`` cut into ``frames`` chunks (as the decoder would present it)."""
    chunks = tuple(c.contiguous() for c in torch.tensor_split(flat, frames)) if frames > 1 else (flat,)
    return Payload(dtype=flat.dtype, chunks=chunks, shapes=SPEC.shapes if shapes is None else shapes)


def state(initial: torch.Tensor | None = None) -> ModelState:
    return ModelState(SPEC, torch.zeros(N) if initial is None else initial)


def test_spec_numel():
    assert N == 23


# ---------------------------------------------------------------------------
# apply


def test_apply_single_fp32_exact():
    init = torch.arange(N, dtype=torch.float32)
    s = state(init)
    delta = torch.linspace(-1, 1, N)
    assert s.apply([(payload(delta), 1.0)]) == 1
    _, flat = s.snapshot()
    assert torch.equal(flat, init + delta)


def test_apply_weighted_group_is_one_step():
    init = torch.ones(N)
    s = state(init)
    d1, d2, d3 = torch.full((N,), 4.0), torch.full((N,), 8.0), torch.full((N,), -2.0)
    version = s.apply([(payload(d1), 0.25), (payload(d2), 0.5), (payload(d3), 0.25)])
    assert version == 1  # one barrier = one version
    _, flat = s.snapshot()
    assert torch.equal(flat, torch.full((N,), 1.0 + 1.0 + 4.0 - 0.5))


def test_apply_matches_fp32_axpy_bitwise():
    g = torch.Generator().manual_seed(0)
    init = torch.randn(N, generator=g)
    deltas = [torch.randn(N, generator=g) for _ in range(5)]
    weights = [0.1, 0.2, 0.3, 0.15, 0.25]
    s = state(init)
    s.apply([(payload(d), w) for d, w in zip(deltas, weights)])
    expected = init.clone()
    for d, w in zip(deltas, weights):
        expected.add_(d, alpha=w)
    assert torch.equal(s.snapshot()[1], expected)


@pytest.mark.parametrize("dtype,delta", [(torch.float16, 2.0**-12), (torch.bfloat16, 2.0**-9)])
def test_low_precision_deltas_accumulate_in_fp32(dtype, delta):
    """Deltas below the half-precision ulp of the weights still add up (fp32 master copy)."""
    s = state(torch.ones(N))
    d = torch.full((N,), delta, dtype=dtype)
    assert float(d[0]) == delta  # exactly representable on the wire
    assert float((torch.ones(1, dtype=dtype) + d[:1])[0]) == 1.0  # but lost if added in `dtype`
    for _ in range(1000):
        s.apply([(payload(d), 1.0)])
    _, flat = s.snapshot()
    assert flat.dtype == torch.float32
    assert torch.equal(flat, torch.full((N,), 1.0 + 1000 * delta))
    assert s.version == 1000


def test_low_precision_payload_values_are_converted_exactly():
    s = state()
    d = torch.tensor([0.5, -1.25, 3.0, 1e-3] * 5 + [0.0, 2.0, -0.0078125], dtype=torch.bfloat16)
    s.apply([(payload(d), 1.0)])
    assert torch.equal(s.snapshot()[1], d.float())


@pytest.mark.parametrize("frames", [2, 3, 7, 23])
def test_multi_chunk_payload_equals_single(frames):
    g = torch.Generator().manual_seed(frames)
    init = torch.randn(N, generator=g)
    delta = torch.randn(N, generator=g)
    one, many = state(init), state(init)
    one.apply([(payload(delta), 0.5)])
    many.apply([(payload(delta, frames=frames), 0.5)])
    assert torch.equal(one.snapshot()[1], many.snapshot()[1])


def test_apply_decoded_multi_frame_message():
    """The real path: a fp16 update encoded in small frames, decoded zero-copy, applied chunk by chunk."""
    delta = torch.linspace(-2, 2, N).half()
    frames = [bytes(f) for f in encode(Header(type=MsgType.PUSH_UPDATE, shapes=SPEC.shapes), delta, max_frame_bytes=10)]
    msg = decode(frames)
    assert len(msg.payload.chunks) == math.ceil(N * 2 / 10)
    validate_update(SPEC, msg.payload)
    s = state(torch.ones(N))
    s.apply([(msg.payload, 1.0)])
    assert torch.equal(s.snapshot()[1], torch.ones(N) + delta.float())


def test_initial_vector_is_copied_and_checked():
    init = torch.zeros(N)
    s = state(init)
    init += 5
    assert torch.equal(s.snapshot()[1], torch.zeros(N))
    with pytest.raises(ValueError, match="elements"):
        ModelState(SPEC, torch.zeros(N + 1))
    assert ModelState(SPEC, torch.zeros(N, dtype=torch.float64)).snapshot()[1].dtype == torch.float32


# ---------------------------------------------------------------------------
# versions and snapshots


def test_version_is_monotonic():
    s = state()
    assert s.version == 0
    seen = [s.apply([(payload(torch.ones(N)), 1.0)]) for _ in range(5)]
    assert seen == [1, 2, 3, 4, 5] and s.version == 5
    assert s.apply([]) == 6  # even an empty step advances (one call, one version)


def test_snapshot_cached_per_version():
    s = state()
    a = s.snapshot()
    assert s.snapshot()[1] is a[1]  # same version: no new copy
    s.apply([(payload(torch.ones(N)), 1.0)])
    b = s.snapshot()
    assert b[1] is not a[1] and b[0] == 1
    assert s.snapshot()[1] is b[1]
    # The wire frames and checksum are cached with the copy.
    assert s.prepared()[1] is s.prepared()[1]


def test_snapshot_unaffected_by_later_applies():
    s = state()
    v0, snap0 = s.snapshot()
    s.apply([(payload(torch.ones(N)), 1.0)])
    s.apply([(payload(torch.ones(N)), 1.0)])
    assert v0 == 0 and torch.equal(snap0, torch.zeros(N))
    v2, snap2 = s.snapshot()
    assert v2 == 2 and torch.equal(snap2, torch.full((N,), 2.0))


def test_snapshot_per_dtype():
    s = state(torch.full((N,), 1.0 + 2.0**-12))
    v32, f32 = s.snapshot(torch.float32)
    v16, f16 = s.snapshot(torch.float16)
    vbf, fbf = s.snapshot(torch.bfloat16)
    assert v32 == v16 == vbf == 0
    assert (f32.dtype, f16.dtype, fbf.dtype) == (torch.float32, torch.float16, torch.bfloat16)
    assert torch.equal(f16, f32.half()) and torch.equal(fbf, f32.bfloat16())
    assert s.snapshot(torch.float16)[1] is s.snapshot(torch.float16)[1]
    assert s.snapshot(torch.float32)[1].data_ptr() != f16.data_ptr()


def test_load_replaces_model_and_version():
    s = state()
    s.snapshot()
    s.load(torch.full((N,), 3.0), version=42)
    assert s.version == 42
    assert torch.equal(s.snapshot()[1], torch.full((N,), 3.0))


# ---------------------------------------------------------------------------
# concurrency


def test_concurrent_applies_lose_no_update():
    threads, per_thread = 8, 200
    s = state()
    barrier = threading.Barrier(threads)
    errors: list[BaseException] = []
    versions: list[list[int]] = [[] for _ in range(threads)]

    def work(i: int) -> None:
        try:
            # Worker i adds (i + 1) to every element, per_thread times: integers stay exact in fp32.
            p = payload(torch.full((N,), float(i + 1)), frames=3)
            barrier.wait()
            for _ in range(per_thread):
                versions[i].append(s.apply([(p, 1.0)]))
                if _ % 50 == 0:
                    v, snap = s.snapshot()
                    # A snapshot is never torn: all elements equal (every update is uniform).
                    assert bool((snap == snap[0]).all()), "torn snapshot"
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=60)
    assert not errors, errors
    assert s.version == threads * per_thread
    all_versions = sorted(v for vs in versions for v in vs)
    assert all_versions == list(range(1, threads * per_thread + 1)), "every apply got its own version"
    expected = per_thread * sum(range(1, threads + 1))  # 200 * 36
    assert torch.equal(s.snapshot()[1], torch.full((N,), float(expected)))


# ---------------------------------------------------------------------------
# validate_update


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_validate_accepts_float_wire_dtypes(dtype):
    validate_update(SPEC, payload(torch.zeros(N, dtype=dtype)))
    validate_update(SPEC, payload(torch.zeros(N, dtype=dtype), shapes=((N,),)))  # flat form
    validate_update(SPEC, payload(torch.zeros(N, dtype=dtype), frames=4))


def _code(p) -> ErrorCode:
    with pytest.raises(ProtocolError) as ei:
        validate_update(SPEC, p)
    return ei.value.code


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("where", [0, N // 2, N - 1])
def test_validate_rejects_non_finite(value, dtype, where):
    d = torch.zeros(N, dtype=dtype)
    d[where] = value
    assert _code(payload(d)) is ErrorCode.NON_FINITE
    assert _code(payload(d, frames=5)) is ErrorCode.NON_FINITE


def test_validate_rejects_overflowing_magnitude():
    d = torch.zeros(N)
    d[0] = d[1] = 3e38  # each finite, their fp32 sum is not
    with pytest.raises(ProtocolError) as ei:
        validate_update(SPEC, payload(d))
    assert ei.value.code is ErrorCode.NON_FINITE and "overflow" in ei.value.message


def test_validate_accepts_a_finite_update_whose_norm_overflows():
    d = torch.zeros(N)
    d[3] = 2e19  # finite, its square is not: left to screening, which refuses it by its (inf) norm
    p = payload(d)
    validate_update(SPEC, p)
    assert p.norm == math.inf


def test_fold_that_overflows_is_rolled_back_and_honest_folds_skip_the_model_pass():
    st = state(torch.ones(N))
    honest = payload(torch.full((N,), 0.5))
    st.apply([(honest, 1.0)])
    assert st.rollbacks == [] and st._bound < 1e37  # bounded: no pass over the model was needed
    huge = torch.zeros(N)
    huge[0] = 3e38  # unvalidated (a journal replay, a bug): its norm is inf, so the fold is checked
    st.apply([(payload(huge), 1.0)])
    st.apply([(payload(huge), 1.0)])  # 6e38: Inf
    assert st.rollbacks and bool(torch.isfinite(st.snapshot()[1]).all())
    assert st._bound < 1e37  # the exact bound is taken again after the check


def test_validate_accepts_large_finite_half_values():
    d = torch.full((N,), 65504.0, dtype=torch.float16)  # fp16 max; the fp32 sum is fine
    validate_update(SPEC, payload(d))


@pytest.mark.parametrize(
    "shapes",
    [((N - 1,),), ((3, 4), (3,)), ((4, 3), (3,), (2, 2, 2)), ((3,), (3, 4), (2, 2, 2)), ((N, 1),), ()],
)
def test_validate_rejects_wrong_shapes(shapes):
    assert _code(payload(torch.zeros(N), shapes=shapes)) is ErrorCode.BAD_SHAPE


@pytest.mark.parametrize("dtype", [torch.float64, torch.int32, torch.int64, torch.uint8, torch.int8, torch.int16])
def test_validate_rejects_wrong_dtype(dtype):
    assert _code(payload(torch.zeros(N, dtype=dtype))) is ErrorCode.BAD_DTYPE


def test_validate_rejects_missing_payload():
    assert _code(None) is ErrorCode.BAD_REQUEST


def test_a_fold_never_leaves_a_running_variance_negative():
    # Deltas are added: two workers' (or a stale) lowering of BatchNorm's running_var took it below zero and
    # the model's next forward to NaN (edge-resnet on lte, 2026-11-27). Only the variances are projected.
    spec = ModelSpec(name="bn", entries=(("bn.weight", (2,)), ("bn.running_mean", (2,)), ("bn.running_var", (2,))))
    st = ModelState(spec, torch.ones(6))
    delta = torch.tensor([-3.0, -3.0, -3.0, -3.0, -0.5, -3.0])
    p = Payload(dtype=torch.float32, chunks=(delta,), shapes=spec.shapes)
    assert torch.equal(st.candidate(p, from_current=True), torch.tensor([-2.0, -2.0, -2.0, -2.0, 0.5, 0.0]))
    st.apply([(p, 1.0)])
    _, after = st.snapshot()
    assert torch.equal(after, torch.tensor([-2.0, -2.0, -2.0, -2.0, 0.5, 0.0]))
    st.blend(Payload(dtype=torch.float32, chunks=(torch.full((6,), -4.0),), shapes=spec.shapes), 1.0)
    _, blended = st.snapshot()
    assert torch.equal(blended, torch.tensor([-3.0, -3.0, -3.0, -3.0, 0.0, 0.0]))
