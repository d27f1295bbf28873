"""Hermes' dual binary search for a worker's dataset size (DSS) and mini-batch size (MBS) (Hermes Sec. IV-A).

Given a worker's cost model and a target cycle time (the cluster's median),
find the (DSS, MBS) on the feasible grid whose predicted cycle time is
closest to the target. The policy that calls it is ``hermes_sizing.py``
(allocation ``dual-search``); straggler detection is ``straggler.py``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from hermes.common.policies.allocation._checks import check_mbs_range, is_int
from hermes.common.policies.allocation.cost_model import CostModel


@dataclass(frozen=True)
class SizingBounds:
    """The feasible (DSS, MBS) grid for one worker.

    DSS candidates are the multiples of ``dss_step`` (the shard size) inside
    [dss_min, dss_max]; bounds that are not multiples are rounded inward, and
    a range with no multiple in it is an error. MBS candidates are the powers
    of two in [mbs_min, mbs_max] (Hermes Sec. IV-A, [15]).
    """

    dss_min: int
    dss_max: int  # min(len(dataset), memory bound), computed by the caller
    mbs_min: int
    mbs_max: int
    dss_step: int = 1

    def __post_init__(self) -> None:
        for name in ("dss_min", "dss_max", "dss_step"):
            v = getattr(self, name)
            if not is_int(v) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if self.dss_max < self.dss_min:
            raise ValueError(f"dss_max must be >= dss_min ({self.dss_min}), got {self.dss_max}")
        check_mbs_range(self.mbs_min, self.mbs_max)
        if self.dss_first > self.dss_max:
            raise ValueError(
                f"dss_step {self.dss_step} has no multiple in [dss_min, dss_max] = [{self.dss_min}, {self.dss_max}]"
            )

    @property
    def dss_first(self) -> int:
        return -(-self.dss_min // self.dss_step) * self.dss_step

    @property
    def dss_grid(self) -> range:
        return range(self.dss_first, (self.dss_max // self.dss_step) * self.dss_step + 1, self.dss_step)

    @property
    def batch_size_grid(self) -> tuple[int, ...]:
        out, m = [], self.mbs_min
        while m <= self.mbs_max:
            out.append(m)
            m *= 2
        return tuple(out)

    def clamp_batch_size(self, batch_size: int) -> int:
        """Largest power of two <= batch_size, held inside [mbs_min, mbs_max]."""
        if not is_int(batch_size) or batch_size < 1:
            raise ValueError(f"preferred_batch_size must be an integer >= 1, got {batch_size!r}")
        p = 1 << (int(batch_size).bit_length() - 1)
        return min(max(p, self.mbs_min), self.mbs_max)


@dataclass(frozen=True)
class SizingResult:
    dss: int
    batch_size: int
    predicted_seconds: float
    target_seconds: float
    within_tolerance: bool
    steps: int  # cost-model probes made (distinct (dss, batch_size) pairs evaluated)

    @property
    def relative_error(self) -> float:
        return abs(self.predicted_seconds - self.target_seconds) / self.target_seconds


class _Prober:
    """Memoised Hermes Eq. 3 evaluations; the number of distinct probes is the search's cost."""

    def __init__(self, model: CostModel) -> None:
        self._model = model
        self._seen: dict[tuple[int, int], float] = {}

    def __call__(self, dss: int, batch_size: int) -> float:
        key = (dss, batch_size)
        if key not in self._seen:
            self._seen[key] = self._model.cycle_seconds(dss, batch_size)
        return self._seen[key]

    @property
    def steps(self) -> int:
        return len(self._seen)


def _closest(probe: _Prober, pairs: list[tuple[int, int]], target: float) -> tuple[int, int, float]:
    # Ties go to the faster pair: a worker a little early waits, one a little late is a straggler.
    best = min(pairs, key=lambda p: (abs(probe(*p) - target), probe(*p)))
    return best[0], best[1], probe(*best)


def _search_dss(probe: _Prober, grid: range, batch_size: int, target: float) -> tuple[int, int, float]:
    """Closest-to-target DSS at a fixed MBS; Eq. 3 is non-decreasing in DSS, so this is exact."""
    lo, hi = 0, len(grid) - 1
    while lo < hi:  # first index whose time reaches the target (or the last index)
        mid = (lo + hi) // 2
        if probe(grid[mid], batch_size) >= target:
            hi = mid
        else:
            lo = mid + 1
    pairs = [(grid[lo], batch_size)] + ([(grid[lo - 1], batch_size)] if lo > 0 else [])
    return _closest(probe, pairs, target)


def _choose_batch_size(probe: _Prober, grid: Sequence[int], dss: int, target: float, want: str, batch_size0: int) -> int:
    """Pick an MBS from ``grid`` (sorted powers of two) at a fixed DSS.

    A larger MBS means fewer steps, so time FALLS as the MBS index RISES. Over
    the powers of two that divide DSS, Eq. 3 is aD/MBS + bD: exactly monotone,
    so those (a prefix of the grid) are binary-searched. Larger powers leave a
    partial last batch that the ceil charges as a full one, which bends the
    curve; there are few of them (log2 of MBS over DSS's largest power-of-two
    divisor), so each is probed.

    want = "faster": of the MBS whose time is <= target (the target is then
    reachable by growing DSS), the one nearest ``batch_size0``; else the fastest.
    Among divisors these lie ABOVE a too-slow batch_size0.
    want = "slower": of the MBS whose time is >= target (reachable by
    shrinking DSS), the one nearest ``batch_size0``; else the slowest. Among
    divisors these lie BELOW a too-fast batch_size0.
    want = "closest": the MBS whose time is closest to the target.
    """
    n_div = sum(1 for m in grid if dss % m == 0)  # grid[:n_div] divide dss
    probed: set[int] = set(range(n_div, len(grid)))  # partial-batch MBS: probe each

    def f(i: int) -> float:
        probed.add(i)
        return probe(dss, grid[i])

    if n_div:
        lo, hi = 0, n_div - 1
        if want == "slower":
            while lo < hi:  # last index with f >= target: a prefix, since f falls
                mid = (lo + hi + 1) // 2
                if f(mid) >= target:
                    lo = mid  # slow enough: a larger MBS may still be
                else:
                    hi = mid - 1  # too fast: smaller MBS
            f(0)  # the slowest divisor, for when nothing reaches the target
        else:
            while lo < hi:  # first index with f <= target: a suffix, since f falls
                mid = (lo + hi) // 2
                if f(mid) <= target:
                    hi = mid  # fast enough: a smaller MBS may still be
                else:
                    lo = mid + 1  # too slow: larger MBS
            f(n_div - 1)  # the fastest divisor, for when nothing reaches the target
        f(lo)
        if lo > 0:
            f(lo - 1)
        if lo + 1 < n_div:
            f(lo + 1)
    idx = sorted(probed)
    t = {i: probe(dss, grid[i]) for i in idx}

    def distance(i: int) -> tuple[int, int]:
        # Nearest to the preferred MBS in index; ties go up (the faster side).
        return abs(grid[i].bit_length() - batch_size0.bit_length()), -i

    if want == "faster":
        ok = [i for i in idx if t[i] <= target]
        return grid[min(ok, key=distance)] if ok else grid[min(idx, key=lambda i: (t[i], -i))]
    if want == "slower":
        ok = [i for i in idx if t[i] >= target]
        return grid[min(ok, key=distance)] if ok else grid[max(idx, key=lambda i: (t[i], -i))]
    return grid[min(idx, key=lambda i: (abs(t[i] - target), distance(i)))]


def dual_binary_search(
    model: CostModel,
    target_seconds: float,
    bounds: SizingBounds,
    *,
    preferred_batch_size: int,
    tolerance: float = 0.1,
) -> SizingResult:
    """(DSS, MBS) whose predicted cycle time (Hermes Eq. 3) is closest to the target (Hermes Sec. IV-A).

    1. MBS stays at ``preferred_batch_size`` (clamped to the powers of two in bounds);
       binary-search DSS over the multiples of ``dss_step`` in [dss_min,
       dss_max] for the time closest to the target, checking both neighbours
       of the final probe. Within ``tolerance * target``: done.
    2. Otherwise search the MBS index among the powers of two, where time
       FALLS as the index RISES (fewer, larger steps):
       - too slow even at dss_min: at dss_min, the MBS nearest the
         preferred one whose time there is <= target (the target is then
         reachable by growing DSS), else the fastest (the largest useful
         MBS). Such MBS lie ABOVE the preferred one, up the index (unless it
         pads a partial last batch, when a smaller divisor can be faster);
       - too fast even at dss_max: at dss_max, the MBS nearest the preferred
         one whose time there is >= target, else the slowest. These lie
         BELOW the preferred one, down the index;
       - neither (the dss_step grid is too coarse around the target at this
         MBS): the MBS whose time is closest to the target at step 1's DSS.
       The powers of two that divide that DSS are binary-searched (Eq. 3 is
       exactly monotone there); the few larger ones, which leave a partial
       last batch, are probed one by one (see ``_choose_batch_size``). MBS above the
       smallest power of two >= DSS are never considered: the share is then
       one batch and a larger MBS only costs more.
       Then redo step 1's DSS search at the chosen MBS.
    3. Return the closer of the two answers (ties keep the preferred MBS),
       with ``within_tolerance`` False when it is not within tolerance. The
       answer is always inside the bounds and never worse than the best DSS
       at the preferred MBS.

    Probes: about 2 lg N + lg K (+ the partial-batch MBS) with N DSS
    candidates and K MBS candidates, within the paper's O(lg N * lg K);
    ``steps`` counts them. Step 1 is exact because Eq. 3 is monotone in DSS.
    Step 2 looks at one DSS only, so when nothing is within tolerance the
    answer is the closest pair this path finds, which is usually, not always,
    the closest pair of the whole grid.
    """
    if isinstance(target_seconds, bool) or not isinstance(target_seconds, (int, float)):
        raise ValueError(f"target_seconds must be a finite number > 0, got {target_seconds!r}")
    if not math.isfinite(target_seconds) or target_seconds <= 0:
        raise ValueError(f"target_seconds must be a finite number > 0, got {target_seconds!r}")
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)):
        raise ValueError(f"tolerance must be a finite number >= 0, got {tolerance!r}")
    if not math.isfinite(tolerance) or tolerance < 0:
        raise ValueError(f"tolerance must be a finite number >= 0, got {tolerance!r}")
    batch_size0 = bounds.clamp_batch_size(preferred_batch_size)
    probe = _Prober(model)
    dss_grid = bounds.dss_grid
    limit = tolerance * target_seconds

    def result(dss: int, batch_size: int, pred: float) -> SizingResult:
        return SizingResult(
            dss=dss,
            batch_size=batch_size,
            predicted_seconds=pred,
            target_seconds=float(target_seconds),
            within_tolerance=abs(pred - target_seconds) <= limit,
            steps=probe.steps,
        )

    first = _search_dss(probe, dss_grid, batch_size0, target_seconds)
    dss1, _, pred1 = first
    if abs(pred1 - target_seconds) <= limit:
        return result(*first)

    cap = 1 << max(dss1 - 1, 0).bit_length()  # smallest power of two >= dss1
    grid = tuple(m for m in bounds.batch_size_grid if m <= cap) or (bounds.mbs_min,)
    if pred1 > target_seconds and dss1 == dss_grid[0]:
        # Too slow even at dss_min: a faster MBS (larger, unless batch_size0 pads a partial batch).
        batch_size1 = _choose_batch_size(probe, grid, dss1, target_seconds, "faster", batch_size0)
    elif pred1 < target_seconds and dss1 == dss_grid[-1]:
        # Too fast even at dss_max: a slower MBS (smaller).
        batch_size1 = _choose_batch_size(probe, grid, dss1, target_seconds, "slower", batch_size0)
    else:
        # The dss_step grid is too coarse around the target at this MBS.
        batch_size1 = _choose_batch_size(probe, grid, dss1, target_seconds, "closest", batch_size0)

    candidates = [first]
    if batch_size1 != batch_size0:
        candidates.append(_search_dss(probe, dss_grid, batch_size1, target_seconds))
    # Stable min: ties keep the preferred MBS (candidates[0]).
    best = min(candidates, key=lambda c: abs(c[2] - target_seconds))
    return result(*best)


