"""Rounding that preserves a sum within bounds (OmniLearn Eq. 8's exact global batch)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hermes.common.policies.allocation.rounding import InfeasibleAllocation, round_preserving_sum

HL8_BSP_CORES = [6, 6, 4, 32]  # OmniLearn Table I, HL8, BSP


def test_round_preserving_sum_respects_bounds_and_redistributes():
    # Fig. 8 bounds (12, 96): worker 3's 10.67 is lifted to 12, the others share 116.
    assert round_preserving_sum(HL8_BSP_CORES, 128, 12, 96) == [16, 16, 12, 84]
    # Upper bound binds: 300 * 32/48 = 200 > 96; the rest share 204.
    out = round_preserving_sum(HL8_BSP_CORES, 300, 12, 96)
    assert sum(out) == 300 and out[3] == 96 and all(12 <= b <= 96 for b in out)
    assert round_preserving_sum([0, 0, 0], 10) == [4, 3, 3]  # all-zero: even split, ties to lower index
    assert round_preserving_sum([1, 0], 5, 0, [2, 10]) == [2, 3]  # zero-valued worker takes the rest


def test_round_preserving_sum_infeasible_is_a_clear_error():
    with pytest.raises(InfeasibleAllocation, match="sum\\(lower\\)=48"):
        round_preserving_sum([1, 1, 1, 1], 40, 12, 96)
    with pytest.raises(InfeasibleAllocation, match="sum\\(upper\\)=384"):
        round_preserving_sum([1, 1, 1, 1], 400, 12, 96)
    with pytest.raises(InfeasibleAllocation):
        round_preserving_sum([1, 1], 10, [6, 1], [5, 9])
    with pytest.raises(ValueError):
        round_preserving_sum([1, -1], 10)


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(st.floats(0, 1e4, allow_nan=False), min_size=1, max_size=12),
    b=st.integers(1, 256),
    b_min=st.integers(1, 16),
    span=st.integers(0, 512),
)
def test_eq8_global_batch_is_exact_for_random_cases(values, b, b_min, span):
    k = len(values)
    total = k * b  # OmniLearn Eq. 8: sum(b_k) = K*b
    b_max = b_min + span
    if k * b_min > total or k * b_max < total:
        with pytest.raises(InfeasibleAllocation):
            round_preserving_sum(values, total, b_min, b_max)
        return
    out = round_preserving_sum(values, total, b_min, b_max)
    assert sum(out) == total
    assert all(b_min <= o <= b_max for o in out)
    # Largest remainder stays within one unit of the real water-filled share when no bound binds.
    if sum(values) > 0 and all(b_min < total * v / sum(values) < b_max for v in values):
        assert all(abs(o - total * v / sum(values)) < 1 + 1e-6 for o, v in zip(out, values))
