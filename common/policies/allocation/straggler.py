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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from hermes.common.policies.allocation._checks import check_mbs_range, finite_values, is_int, is_pow2
from hermes.common.policies.allocation.cost_model import CostModel, constant_k_model, fit_cost_model
from hermes.common.policies.allocation.dual_search import SizingBounds, SizingResult, dual_binary_search

log = logging.getLogger(__name__)

# Box-plot fence multiplier (Hermes Sec. IV-A: t not in [Q1 - 1.5 IQR, Q3 + 1.5 IQR]).
IQR_FENCE = 1.5


# ---------------------------------------------------------------------------
# Outliers


def quartiles(values: Iterable[float]) -> tuple[float, float, float]:
    """(Q1, median, Q3) with numpy's "linear" percentile method (Hermes Sec. IV-A, [14])."""
    arr = finite_values(values, "values")
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
# Policy


FITS = ("linear", "constant")


@dataclass(frozen=True)
class SearchConfig:
    """The sizer's settings. Bare defaults are the paper's rules (balance_band 0, no warm-up) for
    direct use; a run's values come from the config's ``dual_search`` and ``rebalance`` sections
    (``DualSearchParams``, ``RebalanceParams``), which ``hermes_sizing`` passes in full."""

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
        check_mbs_range(self.mbs_min, self.mbs_max)
        t = self.tolerance
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise ValueError(f"tolerance must be a finite number >= 0, got {t!r}")
        if not is_int(self.min_observations) or self.min_observations < 1:
            raise ValueError(f"min_observations must be an integer >= 1, got {self.min_observations!r}")
        if not is_int(self.history) or self.history < self.min_observations:
            raise ValueError(f"history must be an integer >= min_observations, got {self.history!r}")
        if self.fit not in FITS:
            raise ValueError(f"fit must be one of {FITS}, got {self.fit!r}")
        b = self.balance_band
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not math.isfinite(b) or b < 0:
            raise ValueError(f"balance_band must be a finite number >= 0, got {b!r}")
        if not is_int(self.warmup_cycles) or self.warmup_cycles < 0:
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
        if not is_int(dss_step) or dss_step < 1:
            raise ValueError(f"dss_step must be an integer >= 1, got {dss_step!r}")
        if not is_int(dss_max) or dss_max < dss_step:
            raise ValueError(f"dss_max must be an integer >= dss_step ({dss_step}), got {dss_max!r}")
        if not is_int(base_dss) or not 1 <= base_dss <= dss_max:
            raise ValueError(f"base_dss must be an integer in [1, dss_max={dss_max}], got {base_dss!r}")
        if not is_pow2(base_mbs) or not config.mbs_min <= base_mbs <= config.mbs_max:
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
        if not is_int(dss) or dss < 1:
            raise ValueError(f"dss must be an integer >= 1, got {dss!r}")
        if not is_int(mbs) or mbs < 1:
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
        if not is_int(max_dss) or max_dss < self._dss_step:
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
