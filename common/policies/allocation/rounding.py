"""Integer allocations that keep a total exact under per-worker bounds (OmniLearn Eq. 8 constraint).

Shared by static, pcontrol, task_allocation and dynamic_partitioning.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

Bound = int | Sequence[float] | None  # one bound for all, or one per worker (math.inf: none)


class InfeasibleAllocation(ValueError):
    """No integer allocation meets the total and the per-worker bounds."""


def _bounds(n: int, bound: Bound, default: float) -> list[float]:
    if bound is None:
        return [default] * n
    if isinstance(bound, (int, np.integer)):
        return [float(int(bound))] * n
    out: list[float] = list(bound)
    if len(out) != n:
        raise ValueError(f"bounds have {len(out)} entries for {n} workers")
    return out


def round_preserving_sum(values: Sequence[float], total: int, lower: Bound = 0, upper: Bound = None) -> list[int]:
    """Integers proportional to ``values`` that sum to ``total`` exactly, each in [lower, upper].

    OmniLearn Eq. 8 keeps the global batch sum(b_k) = K*b; this is that
    constraint done exactly on integers. First the real-valued allocation
    ``clamp(c * v_k, lower_k, upper_k)`` with c chosen (bisection) so the sum
    is ``total`` (water-filling: clamped workers' excess or shortfall is
    redistributed proportionally among the others); then largest-remainder
    rounding (ties to the lower index) keeps the sum exact without leaving
    the bounds. All-zero values split evenly. Raises InfeasibleAllocation
    when sum(lower) > total or sum(upper) < total.
    """
    n = len(values)
    if n == 0:
        raise ValueError("need at least one worker")
    if isinstance(total, bool) or int(total) != total:
        raise ValueError(f"total must be an integer, got {total!r}")
    total = int(total)
    v = [float(x) for x in values]
    if any(not math.isfinite(x) or x < 0 for x in v):
        raise ValueError(f"values must be finite and non-negative, got {list(values)}")
    lo = _bounds(n, lower, 0)
    hi = _bounds(n, upper, math.inf)
    for i in range(n):
        if lo[i] > hi[i]:
            raise InfeasibleAllocation(f"worker {i}: lower bound {lo[i]} > upper bound {hi[i]}")
    if sum(lo) > total or sum(hi) < total:
        raise InfeasibleAllocation(
            f"cannot split {total} into {n} integers within bounds: sum(lower)={sum(lo)}, sum(upper)={sum(hi)}"
        )
    top = max(v)
    # Scale-free: relative sizes only; shares below 1e-12 of the largest count as zero.
    v = [x / top if top > 0 and x / top >= 1e-12 else 0.0 for x in v]
    if sum(v) == 0:
        v = [1.0] * n

    def fill(c: float) -> list[float]:
        return [min(max(c * x, low), h) for x, low, h in zip(v, lo, hi)]

    if sum(fill(1e300)) < total:
        # Zero-valued workers are stuck at their lower bound however large c
        # is; the positive ones go to their upper bound, the zeros share the rest.
        pos = [i for i in range(n) if v[i] > 0]
        zero = [i for i in range(n) if v[i] == 0]
        rest = round_preserving_sum([1.0] * len(zero), total - int(sum(hi[i] for i in pos)),
                                    [lo[i] for i in zero], [hi[i] for i in zero])
        out = [0] * n
        for i in pos:
            out[i] = int(hi[i])
        for i, r in zip(zero, rest):
            out[i] = r
        return out
    a, b = 0.0, 1.0
    while sum(fill(b)) < total:
        b *= 2.0
    for _ in range(200):
        m = (a + b) / 2
        if sum(fill(m)) < total:
            a = m
        else:
            b = m
    x = fill(b)
    out = [int(math.floor(xi + 1e-9)) for xi in x]
    out = [min(max(o, int(low)), int(h) if h != math.inf else o) for o, low, h in zip(out, lo, hi)]
    short = total - sum(out)
    frac = [xi - o for xi, o in zip(x, out)]
    # Largest remainder: hand out (or take back) single units, most deserving first.
    while short > 0:
        cands = [i for i in range(n) if out[i] + 1 <= hi[i]]
        i = max(cands, key=lambda k: (frac[k], -k))
        out[i] += 1
        frac[i] -= 1.0
        short -= 1
    while short < 0:
        cands = [i for i in range(n) if out[i] - 1 >= lo[i]]
        i = min(cands, key=lambda k: (frac[k], k))
        out[i] -= 1
        frac[i] += 1.0
        short += 1
    return out


