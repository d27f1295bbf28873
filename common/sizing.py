"""Straggler detection and dataset / mini-batch sizing (Hermes Sec. IV-A, Eq. 3).

The parameter server watches each worker's cycle time (the time to train on
its dataset share, DSS samples in mini-batches of MBS). Workers whose time
lies outside the box-plot fences [Q1 - 1.5 IQR, Q3 + 1.5 IQR] are stragglers
(too slow) or under-used (too fast); each of them gets a new (DSS, MBS) whose
predicted cycle time is as close as possible to the median cycle time of the
cluster. Predictions come from a per-worker cost model fitted to its own
history, searched with the dual binary search of Hermes Sec. IV-A.

Everything here is a pure function of its inputs, or (``StragglerSizer``) a
small deterministic policy object around them.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

log = logging.getLogger(__name__)

# Box-plot fence multiplier (Hermes Sec. IV-A: t not in [Q1 - 1.5 IQR, Q3 + 1.5 IQR]).
IQR_FENCE = 1.5


def _is_int(v: object) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _is_pow2(v: int) -> bool:
    return _is_int(v) and v >= 1 and (v & (v - 1)) == 0


def _check_mbs_range(mbs_min: int, mbs_max: int) -> None:
    for name, v in (("mbs_min", mbs_min), ("mbs_max", mbs_max)):
        if not _is_pow2(v):
            raise ValueError(f"{name} must be a power of two, got {v!r}")
    if mbs_max < mbs_min:
        raise ValueError(f"mbs_max must be >= mbs_min ({mbs_min}), got {mbs_max}")


def _finite_values(values: Iterable[float], name: str) -> np.ndarray:
    arr = np.asarray(list(values), dtype=float)
    if arr.size == 0:
        raise ValueError(f"{name} must not be empty")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite, got {arr.tolist()}")
    return arr


# ---------------------------------------------------------------------------
# Outliers


def quartiles(values: Iterable[float]) -> tuple[float, float, float]:
    """(Q1, median, Q3) with numpy's "linear" percentile method (Hermes Sec. IV-A, [14])."""
    arr = _finite_values(values, "values")
    q1, q2, q3 = np.percentile(arr, [25.0, 50.0, 75.0], method="linear")
    return float(q1), float(q2), float(q3)


def iqr_bounds(values: Iterable[float]) -> tuple[float, float]:
    """Box-plot fences [Q1 - 1.5 IQR, Q3 + 1.5 IQR] (Hermes Sec. IV-A)."""
    q1, _, q3 = quartiles(values)
    iqr = q3 - q1
    return q1 - IQR_FENCE * iqr, q3 + IQR_FENCE * iqr


def iqr_outliers(times: Mapping[str, float]) -> dict[str, str]:
    """Workers whose time lies strictly outside the fences: id -> "slow" | "fast".

    Any number of values is accepted, including 0 (no outliers). Note that with
    linear percentiles fewer than 4 values can never produce an outlier: for
    sorted (a, b, c), Q1 = (a+b)/2, Q3 = (b+c)/2 and a < Q1 - 1.5 IQR would need
    0.75c < 0.25a + 0.5b, impossible for a <= b <= c (c is symmetric), and
    n <= 2 is narrower still. So a cluster of three workers is never resized by
    this rule; four is the smallest that can be (e.g. 1, 5.33, 5.33, 8 flags 1).
    The result is ordered by worker id so callers iterate deterministically.
    """
    if not times:
        return {}
    ids = sorted(times)
    lo, hi = iqr_bounds(times[i] for i in ids)
    out: dict[str, str] = {}
    for i in ids:
        t = times[i]
        if t > hi:
            out[i] = "slow"
        elif t < lo:
            out[i] = "fast"
    return out


# ---------------------------------------------------------------------------
# Cost model


@dataclass(frozen=True)
class CostModel:
    """Seconds per mini-batch K(MBS) = a + b * MBS for one worker.

    The paper's K is constant per mini-batch (b = 0). A fixed per-step cost a
    (launch, optimizer step, Python) plus a per-sample cost b is closer to what
    devices do, and it is what makes a larger MBS cheaper per sample.
    """

    a: float
    b: float

    def __post_init__(self) -> None:
        for name in ("a", "b"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")

    def per_batch(self, mbs: int) -> float:
        if not _is_int(mbs) or mbs < 1:
            raise ValueError(f"mbs must be an integer >= 1, got {mbs!r}")
        return self.a + self.b * mbs

    def cycle_seconds(self, dss: int, mbs: int) -> float:
        """t = K(MBS) * E * DSS / MBS with E = 1 (Hermes Eq. 3).

        The batch count is ceil(DSS / MBS): a last, partial mini-batch is still one step.
        """
        if not _is_int(dss) or dss < 1:
            raise ValueError(f"dss must be an integer >= 1, got {dss!r}")
        return self.per_batch(mbs) * (-(-dss // mbs))


def _per_batch_observations(
    observations: Sequence[tuple[int, int, float]], max_history: int
) -> tuple[np.ndarray, np.ndarray]:
    if not _is_int(max_history) or max_history < 1:
        raise ValueError(f"max_history must be an integer >= 1, got {max_history!r}")
    obs = list(observations)[-max_history:]
    if not obs:
        raise ValueError("observations must not be empty")
    mbs = np.empty(len(obs))
    y = np.empty(len(obs))
    for i, item in enumerate(obs):
        if len(item) != 3:
            raise ValueError(f"observations[{i}] must be (mbs, dss, seconds), got {item!r}")
        m, d, s = item
        if not _is_int(m) or m < 1:
            raise ValueError(f"observations[{i}] mbs must be an integer >= 1, got {m!r}")
        if not _is_int(d) or d < 1:
            raise ValueError(f"observations[{i}] dss must be an integer >= 1, got {d!r}")
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s) or s <= 0:
            raise ValueError(f"observations[{i}] seconds must be a finite number > 0, got {s!r}")
        mbs[i] = m
        y[i] = s / (-(-d // m))  # per-batch time, inverting Hermes Eq. 3
    return mbs, y


def fit_cost_model(observations: Sequence[tuple[int, int, float]], *, max_history: int = 20) -> CostModel:
    """Least-squares fit of per-batch time y = a + b * MBS (K of Hermes Eq. 3, made MBS-dependent).

    ``observations`` are (mbs, dss, cycle_seconds), most recent last; only the
    last ``max_history`` are used so the model follows a device whose speed
    changes. Per-batch time is y = seconds / ceil(dss / mbs).
    """
    mbs, y = _per_batch_observations(observations, max_history)
    if np.unique(mbs).size < 2:
        # One MBS cannot separate the per-step cost a from the per-sample cost b.
        # Assume cost proportional to samples (a = 0): it predicts the same
        # per-sample speed at any MBS, the neutral guess; a constant K instead
        # would claim that doubling MBS halves the cycle time. Once the worker
        # has run at a second MBS the fit separates a and b.
        return CostModel(a=0.0, b=float(np.mean(y) / mbs[0]))
    m_mean, y_mean = float(np.mean(mbs)), float(np.mean(y))
    b = float(np.sum((mbs - m_mean) * (y - y_mean)) / np.sum((mbs - m_mean) ** 2))
    a = y_mean - b * m_mean
    # Negative costs are noise, not physics; refit the other coefficient alone.
    # a < 0 and b < 0 cannot both happen: y_mean = a + b * m_mean > 0.
    if a < 0:
        a, b = 0.0, float(np.sum(mbs * y) / np.sum(mbs * mbs))
    elif b < 0:
        a, b = y_mean, 0.0
    return CostModel(a=max(a, 0.0), b=max(b, 0.0))


def constant_k_model(observations: Sequence[tuple[int, int, float]], *, max_history: int = 20) -> CostModel:
    """The paper's assumption: K is a constant time per mini-batch (Hermes Eq. 3): a = mean(y), b = 0."""
    _, y = _per_batch_observations(observations, max_history)
    return CostModel(a=float(np.mean(y)), b=0.0)


# ---------------------------------------------------------------------------
# Dual binary search


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
            if not _is_int(v) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if self.dss_max < self.dss_min:
            raise ValueError(f"dss_max must be >= dss_min ({self.dss_min}), got {self.dss_max}")
        _check_mbs_range(self.mbs_min, self.mbs_max)
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
    def mbs_grid(self) -> tuple[int, ...]:
        out, m = [], self.mbs_min
        while m <= self.mbs_max:
            out.append(m)
            m *= 2
        return tuple(out)

    def clamp_mbs(self, mbs: int) -> int:
        """Largest power of two <= mbs, held inside [mbs_min, mbs_max]."""
        if not _is_int(mbs) or mbs < 1:
            raise ValueError(f"preferred_mbs must be an integer >= 1, got {mbs!r}")
        p = 1 << (int(mbs).bit_length() - 1)
        return min(max(p, self.mbs_min), self.mbs_max)


@dataclass(frozen=True)
class SizingResult:
    dss: int
    mbs: int
    predicted_seconds: float
    target_seconds: float
    within_tolerance: bool
    steps: int  # cost-model probes made (distinct (dss, mbs) pairs evaluated)

    @property
    def relative_error(self) -> float:
        return abs(self.predicted_seconds - self.target_seconds) / self.target_seconds


class _Prober:
    """Memoised Hermes Eq. 3 evaluations; the number of distinct probes is the search's cost."""

    def __init__(self, model: CostModel) -> None:
        self._model = model
        self._seen: dict[tuple[int, int], float] = {}

    def __call__(self, dss: int, mbs: int) -> float:
        key = (dss, mbs)
        if key not in self._seen:
            self._seen[key] = self._model.cycle_seconds(dss, mbs)
        return self._seen[key]

    @property
    def steps(self) -> int:
        return len(self._seen)


def _closest(probe: _Prober, pairs: list[tuple[int, int]], target: float) -> tuple[int, int, float]:
    # Ties go to the faster pair: a worker a little early waits, one a little late is a straggler.
    best = min(pairs, key=lambda p: (abs(probe(*p) - target), probe(*p)))
    return best[0], best[1], probe(*best)


def _search_dss(probe: _Prober, grid: range, mbs: int, target: float) -> tuple[int, int, float]:
    """Closest-to-target DSS at a fixed MBS; Eq. 3 is non-decreasing in DSS, so this is exact."""
    lo, hi = 0, len(grid) - 1
    while lo < hi:  # first index whose time reaches the target (or the last index)
        mid = (lo + hi) // 2
        if probe(grid[mid], mbs) >= target:
            hi = mid
        else:
            lo = mid + 1
    pairs = [(grid[lo], mbs)] + ([(grid[lo - 1], mbs)] if lo > 0 else [])
    return _closest(probe, pairs, target)


def _choose_mbs(probe: _Prober, grid: Sequence[int], dss: int, target: float, want: str, mbs0: int) -> int:
    """Pick an MBS from ``grid`` (sorted powers of two) at a fixed DSS.

    A larger MBS means fewer steps, so time FALLS as the MBS index RISES. Over
    the powers of two that divide DSS, Eq. 3 is aD/MBS + bD: exactly monotone,
    so those (a prefix of the grid) are binary-searched. Larger powers leave a
    partial last batch that the ceil charges as a full one, which bends the
    curve; there are few of them (log2 of MBS over DSS's largest power-of-two
    divisor), so each is probed.

    want = "faster": of the MBS whose time is <= target (the target is then
    reachable by growing DSS), the one nearest ``mbs0``; else the fastest.
    Among divisors these lie ABOVE a too-slow mbs0.
    want = "slower": of the MBS whose time is >= target (reachable by
    shrinking DSS), the one nearest ``mbs0``; else the slowest. Among
    divisors these lie BELOW a too-fast mbs0.
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
        return abs(grid[i].bit_length() - mbs0.bit_length()), -i

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
    preferred_mbs: int,
    tolerance: float = 0.1,
) -> SizingResult:
    """(DSS, MBS) whose predicted cycle time (Hermes Eq. 3) is closest to the target (Hermes Sec. IV-A).

    1. MBS stays at ``preferred_mbs`` (clamped to the powers of two in bounds);
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
       last batch, are probed one by one (see ``_choose_mbs``). MBS above the
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
    mbs0 = bounds.clamp_mbs(preferred_mbs)
    probe = _Prober(model)
    dss_grid = bounds.dss_grid
    limit = tolerance * target_seconds

    def result(dss: int, mbs: int, pred: float) -> SizingResult:
        return SizingResult(
            dss=dss,
            mbs=mbs,
            predicted_seconds=pred,
            target_seconds=float(target_seconds),
            within_tolerance=abs(pred - target_seconds) <= limit,
            steps=probe.steps,
        )

    first = _search_dss(probe, dss_grid, mbs0, target_seconds)
    dss1, _, pred1 = first
    if abs(pred1 - target_seconds) <= limit:
        return result(*first)

    cap = 1 << max(dss1 - 1, 0).bit_length()  # smallest power of two >= dss1
    grid = tuple(m for m in bounds.mbs_grid if m <= cap) or (bounds.mbs_min,)
    if pred1 > target_seconds and dss1 == dss_grid[0]:
        # Too slow even at dss_min: a faster MBS (larger, unless mbs0 pads a partial batch).
        mbs1 = _choose_mbs(probe, grid, dss1, target_seconds, "faster", mbs0)
    elif pred1 < target_seconds and dss1 == dss_grid[-1]:
        # Too fast even at dss_max: a slower MBS (smaller).
        mbs1 = _choose_mbs(probe, grid, dss1, target_seconds, "slower", mbs0)
    else:
        # The dss_step grid is too coarse around the target at this MBS.
        mbs1 = _choose_mbs(probe, grid, dss1, target_seconds, "closest", mbs0)

    candidates = [first]
    if mbs1 != mbs0:
        candidates.append(_search_dss(probe, dss_grid, mbs1, target_seconds))
    # Stable min: ties keep the preferred MBS (candidates[0]).
    best = min(candidates, key=lambda c: abs(c[2] - target_seconds))
    return result(*best)


# ---------------------------------------------------------------------------
# Policy


FITS = ("linear", "constant")


@dataclass(frozen=True)
class SearchConfig:
    mbs_min: int = 8
    mbs_max: int = 256
    tolerance: float = 0.1
    history: int = 20  # observations per worker kept for the cost fit
    fit: str = "linear"  # "linear": K = a + b*MBS fitted; "constant": the paper's constant K
    min_observations: int = 2  # per worker before it may be resized
    # Beyond the paper, from testbed measurements (benchmarks/compare_presets.py):
    # with 4 workers the IQR fences can sit at ~1.6x the median, so a 1.4-1.7x
    # straggler went unflagged. A worker further than balance_band * median
    # from the median is resized too. 0 keeps the paper's IQR-only rule.
    balance_band: float = 0.0
    # A worker's first cycles carry one-off costs (allocator warm-up, the
    # first pull); they are kept out of its cost fit and its detection.
    warmup_cycles: int = 0

    def __post_init__(self) -> None:
        _check_mbs_range(self.mbs_min, self.mbs_max)
        t = self.tolerance
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise ValueError(f"tolerance must be a finite number >= 0, got {t!r}")
        if not _is_int(self.min_observations) or self.min_observations < 1:
            raise ValueError(f"min_observations must be an integer >= 1, got {self.min_observations!r}")
        if not _is_int(self.history) or self.history < self.min_observations:
            raise ValueError(f"history must be an integer >= min_observations, got {self.history!r}")
        if self.fit not in FITS:
            raise ValueError(f"fit must be one of {FITS}, got {self.fit!r}")
        b = self.balance_band
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not math.isfinite(b) or b < 0:
            raise ValueError(f"balance_band must be a finite number >= 0, got {b!r}")
        if not _is_int(self.warmup_cycles) or self.warmup_cycles < 0:
            raise ValueError(f"warmup_cycles must be an integer >= 0, got {self.warmup_cycles!r}")


@dataclass(frozen=True)
class _Observation:
    dss: int
    mbs: int
    seconds: float


class StragglerSizer:
    """Hermes Sec. IV-A as a small policy object: the engine feeds it each worker's cycle times and asks for workloads.

    ``rebalance`` rule, deterministic given the observations:
    - eligible workers: at least ``min_observations`` observations;
    - each eligible worker's latest cycle time; target = their median;
    - IQR outliers among those times (Hermes: t not in [Q1 - 1.5 IQR, Q3 + 1.5 IQR])
      are resized by ``dual_binary_search`` with their own fitted cost model,
      preferring their current MBS; non-outliers keep their workload;
    - a resized outlier whose latest observation is not at its assigned
      workload has not reported since the resize: its time is stale, so it is
      not resized again until it does (the stale time still counts in the
      median and fences, as the latest time we have). Workers never resized
      are not held to the base workload: the engine may start them elsewhere;
    - the result names only workers whose workload changed.
    """

    def __init__(self, config: SearchConfig, *, base_dss: int, base_mbs: int, dss_step: int, dss_max: int) -> None:
        if not _is_int(dss_step) or dss_step < 1:
            raise ValueError(f"dss_step must be an integer >= 1, got {dss_step!r}")
        if not _is_int(dss_max) or dss_max < dss_step:
            raise ValueError(f"dss_max must be an integer >= dss_step ({dss_step}), got {dss_max!r}")
        if not _is_int(base_dss) or not 1 <= base_dss <= dss_max:
            raise ValueError(f"base_dss must be an integer in [1, dss_max={dss_max}], got {base_dss!r}")
        if not _is_pow2(base_mbs) or not config.mbs_min <= base_mbs <= config.mbs_max:
            raise ValueError(
                f"base_mbs must be a power of two in [{config.mbs_min}, {config.mbs_max}], got {base_mbs!r}"
            )
        self._config = config
        self._base = (int(base_dss), int(base_mbs))
        self._dss_step = int(dss_step)
        self._dss_max = int(dss_max)
        self._history: dict[str, deque[_Observation]] = {}
        self._workload: dict[str, tuple[int, int]] = {}
        self._memory_cap: dict[str, int] = {}
        self._seen: dict[str, int] = {}

    @property
    def config(self) -> SearchConfig:
        return self._config

    def observe(self, worker_id: str, dss: int, mbs: int, seconds: float) -> None:
        """One finished cycle: the workload it actually ran and how long it took."""
        if not isinstance(worker_id, str) or not worker_id:
            raise ValueError(f"worker_id must be a non-empty string, got {worker_id!r}")
        if not _is_int(dss) or dss < 1:
            raise ValueError(f"dss must be an integer >= 1, got {dss!r}")
        if not _is_int(mbs) or mbs < 1:
            raise ValueError(f"mbs must be an integer >= 1, got {mbs!r}")
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
            raise ValueError(f"seconds must be a finite number > 0, got {seconds!r}")
        if seconds <= 0:
            raise ValueError(f"seconds must be a finite number > 0, got {seconds!r}")
        seen = self._seen[worker_id] = self._seen.get(worker_id, 0) + 1
        if seen <= self._config.warmup_cycles:
            return
        hist = self._history.setdefault(worker_id, deque(maxlen=self._config.history))
        hist.append(_Observation(int(dss), int(mbs), float(seconds)))

    def forget(self, worker_id: str) -> None:
        """A worker left: drop its history, workload and memory cap."""
        self._history.pop(worker_id, None)
        self._workload.pop(worker_id, None)
        self._memory_cap.pop(worker_id, None)
        self._seen.pop(worker_id, None)

    def state_dict(self) -> dict:
        """Plain JSON-able state for a server checkpoint."""
        return {
            "history": {w: [[o.dss, o.mbs, o.seconds] for o in h] for w, h in self._history.items()},
            "workload": {w: list(v) for w, v in self._workload.items()},
            "memory_cap": dict(self._memory_cap),
            "seen": dict(self._seen),
        }

    def load_state_dict(self, state: Mapping) -> None:
        # Everything is parsed before anything is replaced: a bad state leaves the sizer as it was.
        history = {str(w): deque((_Observation(int(d), int(m), float(t)) for d, m, t in h),
                                 maxlen=self._config.history) for w, h in state["history"].items()}
        workload = {str(w): (int(v[0]), int(v[1])) for w, v in state["workload"].items()}
        memory_cap = {str(w): int(v) for w, v in state["memory_cap"].items()}
        seen = {str(w): int(v) for w, v in state["seen"].items()}
        self._history, self._workload, self._memory_cap, self._seen = history, workload, memory_cap, seen

    def params(self) -> dict:
        """What a saved workload means: the base workload and the (DSS, MBS) grid it lies on."""
        return {"base_dss": self._base[0], "base_mbs": self._base[1], "dss_step": self._dss_step,
                "dss_max": self._dss_max, "mbs_min": self._config.mbs_min, "mbs_max": self._config.mbs_max}

    def _dss_cap(self, worker_id: str) -> int:
        return min(self._dss_max, self._memory_cap.get(worker_id, self._dss_max))

    def workload(self, worker_id: str) -> tuple[int, int]:
        """Current (dss, mbs); the base workload (under the memory cap) for workers never resized."""
        if worker_id in self._workload:
            return self._workload[worker_id]
        dss, mbs = self._base
        cap = self._dss_cap(worker_id)
        if dss > cap:
            dss = (cap // self._dss_step) * self._dss_step
        return dss, mbs

    def set_memory_limit(self, worker_id: str, max_dss: int) -> None:
        """Per-worker DSS cap from its memory; a current workload above it is cut down at once."""
        if not _is_int(max_dss) or max_dss < self._dss_step:
            raise ValueError(f"max_dss must be an integer >= dss_step ({self._dss_step}), got {max_dss!r}")
        self._memory_cap[worker_id] = int(max_dss)
        if worker_id in self._workload:
            dss, mbs = self._workload[worker_id]
            cap = self._dss_cap(worker_id)
            if dss > cap:
                # Memory is a hard limit: shrink now rather than wait for the next rebalance.
                self._workload[worker_id] = ((cap // self._dss_step) * self._dss_step, mbs)

    def _model(self, worker_id: str) -> CostModel:
        obs = [(o.mbs, o.dss, o.seconds) for o in self._history[worker_id]]
        if self._config.fit == "constant":
            return constant_k_model(obs, max_history=self._config.history)
        return fit_cost_model(obs, max_history=self._config.history)

    def rebalance(self) -> dict[str, SizingResult]:
        cfg = self._config
        latest = {
            w: hist[-1] for w, hist in sorted(self._history.items()) if len(hist) >= cfg.min_observations
        }
        if not latest:
            return {}
        times = {w: self._comparable_seconds(w, o) for w, o in latest.items()}
        _, target, _ = quartiles(times.values())
        # Hermes Sec. IV-A: t outside [Q1 - 1.5 IQR, Q3 + 1.5 IQR] is a straggler (or an under-used fast node).
        candidates = dict(iqr_outliers(times))
        if cfg.balance_band > 0:
            for w, t in times.items():
                if abs(t - target) > cfg.balance_band * target:
                    candidates.setdefault(w, "slow" if t > target else "fast")
        resized: dict[str, SizingResult] = {}
        for w, side in sorted(candidates.items()):
            current = self.workload(w)
            if w in self._workload and (latest[w].dss, latest[w].mbs) != current:
                continue  # resized, not reported since: its time predates the new workload
            if abs(times[w] - target) <= cfg.tolerance * target:
                continue  # deadband: already as close as the search would aim for
            bounds = SizingBounds(
                dss_min=self._dss_step,
                dss_max=self._dss_cap(w),
                mbs_min=cfg.mbs_min,
                mbs_max=cfg.mbs_max,
                dss_step=self._dss_step,
            )
            model = self._model(w)
            res = dual_binary_search(model, target, bounds, preferred_mbs=current[1], tolerance=cfg.tolerance)
            log.debug(
                "worker %s %s (%.4gs vs median %.4gs): (%d, %d) -> (%d, %d), predicted %.4gs",
                w, side, times[w], target, *current, res.dss, res.mbs, res.predicted_seconds,
            )
            before = model.cycle_seconds(*current)
            # A noisy last cycle or a stale fit must never move a straggler the wrong way.
            wrong_way = res.predicted_seconds > before if side == "slow" else res.predicted_seconds < before
            if (res.dss, res.mbs) != current and not wrong_way:
                self._workload[w] = (res.dss, res.mbs)
                resized[w] = res
        return resized

    def _comparable_seconds(self, worker_id: str, obs: _Observation) -> float:
        """The last cycle's time scaled to the worker's assigned DSS.

        An assignment cut short (end of the data, a shard-granular remainder)
        ran fewer samples than assigned; judging it raw would call a loaded
        worker fast. Time is taken as proportional to samples at equal MBS.
        """
        dss, mbs = self.workload(worker_id)
        if obs.mbs == mbs and obs.dss != dss:
            return obs.seconds * dss / obs.dss
        return obs.seconds
