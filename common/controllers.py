"""Allocation policy math: who gets how much work. Pure functions, small classes.

Nothing here touches the engine, a socket or a tensor; every policy is a
deterministic function of its inputs (measurements in, workloads out):

- ``static_batches``: open-loop batches proportional to cores/FLOPs
  (OmniLearn Eq. 4a, ACSOS static variable batching).
- ``round_preserving_sum``: integer batches that keep the global batch exact
  under per-worker bounds (OmniLearn Eq. 8 constraint).
- ``ProportionalController``: OmniLearn Eq. 6-8 / ACSOS Eq. 4-5 dynamic
  batching with EWMA smoothing, dead-band (OmniLearn Eq. 7), bounds and the
  ACSOS throughput-drop b_max rule; ``fit_memory_model`` /
  ``max_batch_for_memory`` for b_max from memory (OmniLearn Eq. 9).
- ``adaptive_accumulation`` / ``AdaptiveAccumulation``: Chao et al. Eq. 10
  (closed form of appendix Eq. 22), micro-batches per aggregation.
- ``partition_sizes`` / ``partition``: DP-SGD Algorithm 1 per-epoch data
  partitions proportional to measured compute power (Eq. 2).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

Bound = int | Sequence[int] | None


class InfeasibleAllocation(ValueError):
    """No integer allocation meets the total and the per-worker bounds."""


def _bounds(n: int, bound: Bound, default: float) -> list[float]:
    if bound is None:
        return [default] * n
    if isinstance(bound, (int, np.integer)):
        return [int(bound)] * n
    out = list(bound)
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


def static_batches(capacities: Sequence[float], global_batch: int, *, lower: Bound = 1, upper: Bound = None) -> list[int]:
    """OmniLearn Eq. 4a / ACSOS static policy: b_k = c_k / sum(c) * K*b, exact sum.

    ``capacities`` are cores or FLOPs per worker; ``global_batch`` is K*b.
    """
    if any(c <= 0 for c in capacities):
        raise ValueError(f"capacities must be positive, got {list(capacities)}")
    return round_preserving_sum(capacities, global_batch, lower, upper)


# ---------------------------------------------------------------------------
# Memory model (OmniLearn Eq. 9)


def fit_memory_model(samples: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares fit of memory = m0 + m1 * batch (OmniLearn Eq. 9, Fig. 6).

    Eq. 9: M_total = M_model + M_grad + M_opt + M_act + M_batch. The first
    three do not depend on the batch (m0); M_act and M_batch grow linearly
    with it (Fig. 6a/6b), so their sum is m1 per sample.
    """
    if len({b for b, _ in samples}) < 2:
        raise ValueError("need measurements at two or more distinct batch sizes")
    b = np.array([s[0] for s in samples], dtype=float)
    m = np.array([s[1] for s in samples], dtype=float)
    m1, m0 = np.polyfit(b, m, 1)
    return float(m0), float(m1)


def max_batch_for_memory(m0: float, m1: float, budget: float) -> int:
    """Largest batch b with m0 + m1*b <= budget (OmniLearn Eq. 9 cap on b_max)."""
    if m1 <= 0:
        raise ValueError(f"per-sample memory m1 must be positive, got {m1}")
    b = math.floor((budget - m0) / m1 + 1e-9)
    if b < 1:
        raise ValueError(f"budget {budget} bytes does not fit one sample (m0={m0:.0f}, m1={m1:.0f})")
    return b


# ---------------------------------------------------------------------------
# Proportional controller (OmniLearn Eq. 6-8, ACSOS Eq. 4-5)


@dataclass
class _WorkerState:
    batch: int
    hard_max: int  # configured bound and memory model: never lifted
    ewma: float | None = None
    # For the ACSOS throughput-drop rule: batch and throughput before the last increase.
    before_increase: tuple[int, float] | None = None
    drop_cap: int | None = None
    drop_cap_age: int = 0

    @property
    def b_max(self) -> int:
        return self.hard_max if self.drop_cap is None else min(self.hard_max, self.drop_cap)


@dataclass
class ProportionalController:
    """Dynamic batching: equalise per-iteration compute time across workers.

    Per update (OmniLearn: every epoch; ACSOS: any iteration), for each worker k
    with smoothed compute time t_k at batch b_k:

    - X_k = b_k / t_k, tau_k = t_k - mean(t) (OmniLearn Eq. 6a)
    - b_k' = b_k - X_k * tau_k = b_k * mean(t) / t_k (Eq. 6b; ACSOS Eq. 4-5),
      i.e. proportional to throughput;
    - global batch (``global_batch`` set, BSP): rescaled to sum to B
      (Eq. 8), so b_k' = B * X_k / sum(X); ``global_rule='uniform'`` uses Eq. 8
      literally instead (subtract dB/K from every worker);
      without ``global_batch`` (ASP, and OmniLearn Fig. 8) no global rule;
    - bounds [b_min, b_max_k] (b_max_k per worker: memory, throughput drop);
    - dead-band (OmniLearn Eq. 7): a change counts only if
      |b_k' - b_k| / b_k' >= deadband. Without a global batch each worker is
      gated on its own; with one, the step is taken (for every worker) when
      any worker's change counts, else nothing changes (ACSOS dead-band), so
      sum(b) = B holds after every step.

    Smoothing: EWMA of the per-iteration compute time since the worker's last
    batch change, t <- alpha*t_new + (1-alpha)*t (ACSOS "EWMA across all the
    iterations since the previous batch readjustment"); alpha = 0.3 by
    default, so the newest iteration weighs most but one outlier moves the
    estimate by less than a third. With ``carry_smoothing`` the estimate
    survives a change, rescaled by b_new/b_old, instead of restarting from
    the few cycles since: where cycle times jitter by tens of percent (a
    shared CPU), a restart left each step to 2-3 noisy cycles and the
    controller chased noise (measured: 400+ adjustments in 50 s at HL8).

    Throughput drop (ACSOS Sec. "Batch size bounds"): if a worker's
    throughput after increasing its batch from b0 to b is lower than at b0
    (by more than ``drop_margin``, relative; 0 = the paper's rule), its b_max
    becomes b0. With ``drop_cap_updates`` set, that cap is lifted again after
    so many control steps: a throughput curve measured under one resource
    availability says little once it changes (OmniLearn's dynamic
    heterogeneity), and a cap learned from one noisy step would otherwise
    pin a worker for the rest of the run. Memory caps are never lifted.

    Until every worker has at least one measurement at its current batch,
    ``update`` changes nothing.
    """

    batches: Mapping[str, int]
    b_min: int = 1
    b_max: int = 1 << 30
    deadband: float = 0.1
    alpha: float = 0.3
    global_batch: int | None = None
    global_rule: str = "proportional"
    drop_margin: float = 0.0
    drop_cap_updates: int | None = None
    carry_smoothing: bool = False
    workers: dict[str, _WorkerState] = field(init=False)
    adjustments: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        if not 0 < self.alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {self.alpha}")
        if self.deadband < 0:
            raise ValueError(f"deadband must be >= 0, got {self.deadband}")
        if not 1 <= self.b_min <= self.b_max:
            raise ValueError(f"need 1 <= b_min <= b_max, got ({self.b_min}, {self.b_max})")
        if self.global_rule not in ("proportional", "uniform"):
            raise ValueError(f"global_rule must be 'proportional' or 'uniform', got {self.global_rule!r}")
        self.workers = {}
        for w, b in self.batches.items():
            self.add_worker(w, b)

    # ---- membership and limits -------------------------------------------

    def add_worker(self, worker: str, batch: int) -> None:
        self.workers[worker] = _WorkerState(batch=int(batch), hard_max=self.b_max)

    def remove_worker(self, worker: str) -> None:
        self.workers.pop(worker, None)

    def set_b_max(self, worker: str, b_max: int) -> None:
        """Lower a worker's b_max (memory model, OmniLearn Eq. 9); never below b_min."""
        st = self.workers[worker]
        st.hard_max = max(self.b_min, min(st.hard_max, int(b_max)))

    def batch(self, worker: str) -> int:
        return self.workers[worker].batch

    def b_max_of(self, worker: str) -> int:
        return self.workers[worker].b_max

    # ---- measurements ----------------------------------------------------

    def observe(self, worker: str, seconds: float) -> None:
        """One iteration's compute time at the worker's current batch."""
        if not (math.isfinite(seconds) and seconds > 0):
            raise ValueError(f"compute time must be positive, got {seconds!r}")
        st = self.workers[worker]
        st.ewma = seconds if st.ewma is None else self.alpha * seconds + (1 - self.alpha) * st.ewma

    def smoothed(self, worker: str) -> float | None:
        return self.workers[worker].ewma

    # ---- checkpoints -----------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Plain JSON-able: per-worker batch, caps, smoothed time and throughput-drop memory."""
        workers = {w: {"batch": st.batch, "hard_max": st.hard_max, "ewma": st.ewma,
                       "before_increase": None if st.before_increase is None else list(st.before_increase),
                       "drop_cap": st.drop_cap, "drop_cap_age": st.drop_cap_age}
                   for w, st in self.workers.items()}
        return {"workers": workers, "global_batch": self.global_batch, "adjustments": self.adjustments}

    def restored(self, state: Mapping[str, Any]) -> ProportionalController:
        """A controller with these settings in the saved state (a new object: a bad state leaves this one alone)."""
        out = dataclasses.replace(self, batches={})
        for w, st in state["workers"].items():
            before = st["before_increase"]
            out.workers[str(w)] = _WorkerState(
                batch=int(st["batch"]), hard_max=int(st["hard_max"]),
                ewma=None if st["ewma"] is None else float(st["ewma"]),
                before_increase=None if before is None else (int(before[0]), float(before[1])),
                drop_cap=None if st["drop_cap"] is None else int(st["drop_cap"]),
                drop_cap_age=int(st["drop_cap_age"]),
            )
        out.global_batch = None if state["global_batch"] is None else int(state["global_batch"])
        out.adjustments = int(state["adjustments"])
        return out

    # ---- the control step ------------------------------------------------

    def update(self) -> dict[str, int]:
        ws = sorted(self.workers)
        if not ws or any(self.workers[w].ewma is None for w in ws):
            return {w: self.workers[w].batch for w in ws}
        st = {w: self.workers[w] for w in ws}
        t = {w: st[w].ewma for w in ws}
        x = {w: st[w].batch / t[w] for w in ws}  # throughput X_k, OmniLearn Eq. 6a
        # ACSOS throughput-drop rule: b_max <- b0 when X fell after b0 -> b.
        # A fall within ``drop_margin`` is measurement noise: one noisy cycle
        # on a shared machine would otherwise cap a fast worker for good.
        for w in ws:
            if st[w].drop_cap is not None:
                st[w].drop_cap_age += 1
                if self.drop_cap_updates is not None and st[w].drop_cap_age > self.drop_cap_updates:
                    st[w].drop_cap = None
            if st[w].before_increase is not None:
                b0, x0 = st[w].before_increase
                if x[w] < x0 * (1.0 - self.drop_margin):
                    st[w].drop_cap, st[w].drop_cap_age = max(self.b_min, min(st[w].b_max, b0)), 0
                st[w].before_increase = None
        t_bar = sum(t.values()) / len(ws)
        # OmniLearn Eq. 6b / ACSOS Eq. 4-5: b' = b - X*(t - t_bar) = X * t_bar.
        proposal = {w: st[w].batch - x[w] * (t[w] - t_bar) for w in ws}
        lo = [self.b_min] * len(ws)
        hi = [st[w].b_max for w in ws]
        old = {w: st[w].batch for w in ws}
        if self.global_batch is None:
            new = {w: int(min(max(math.floor(proposal[w] + 0.5), self.b_min), st[w].b_max)) for w in ws}
        else:
            new = dict(zip(ws, self._global(ws, [proposal[w] for w in ws], self.global_batch, lo, hi)))
        # Dead-band, OmniLearn Eq. 7: change only if |b' - b| / b' >= deadband.
        moving = [w for w in ws if new[w] != old[w] and abs(new[w] - old[w]) / new[w] >= self.deadband]
        if self.global_batch is None:
            # Per worker (OmniLearn Eq. 7): small moves are dropped one by one.
            new = {w: (new[w] if w in moving else old[w]) for w in ws}
        elif not moving and sum(old.values()) == self.global_batch:
            # Under the global rule the dead-band gates the whole step (ACSOS: "if the change
            # on all workers is less than the threshold, no readjustment"): freezing single
            # workers would pin the others, since the batches must still sum to B.
            new = old
        changed = [w for w in ws if new[w] != old[w]]
        for w in changed:
            if new[w] > old[w]:
                st[w].before_increase = (old[w], x[w])
            st[w].batch = new[w]
            if self.carry_smoothing:
                # The prior at the new batch is the old estimate scaled by the
                # proportional model (t ∝ b); the new batch's cycles then blend in.
                st[w].ewma = st[w].ewma * new[w] / old[w]
            else:
                st[w].ewma = None  # ACSOS: smoothing restarts at the new batch
        if changed:
            self.adjustments += 1
        return {w: st[w].batch for w in ws}

    def _global(self, ws: list[str], proposal: list[float], total: int, lo: list[int], hi: list[int]) -> list[int]:
        # Caps lowered by the throughput-drop rule (or memory) may no longer
        # hold B together: then every worker runs at its cap, the most the
        # cluster can do, rather than failing the step.
        total = min(total, sum(hi))
        if self.global_rule == "uniform":
            # OmniLearn Eq. 8 literally: b_k <- b_k' - dB/K, dB = sum(b') - K*b.
            shift = (sum(proposal) - total) / len(ws)
            proposal = [max(p - shift, 0.0) for p in proposal]
        # "proportionately reducing adjusted batches" (OmniLearn Sec. III-B1):
        # b_k = B * X_k / sum(X), exact integers within bounds.
        return round_preserving_sum(proposal, total, lo, hi)


# ---------------------------------------------------------------------------
# Adaptive task allocation via gradient accumulation (Chao et al.)


def task_allocation_targets(current: Sequence[float], compute_times: Sequence[float]) -> list[float]:
    """Chao et al. Eq. 10: w_i' = (w_i / t_i) / sum_j (w_j / t_j) * sum_j w_j (real-valued).

    Equals w_i + u_i with u from the appendix closed form (Eq. 22), v_i ∝ w_i / t_i.
    """
    if len(current) != len(compute_times) or not current:
        raise ValueError("need one compute time per worker")
    if any(t <= 0 for t in compute_times) or any(w <= 0 for w in current):
        raise ValueError("task amounts and compute times must be positive")
    v = [w / t for w, t in zip(current, compute_times)]
    c = sum(current)
    return [vi / sum(v) * c for vi in v]


def adaptive_accumulation(
    compute_times: Sequence[float], total_steps: int, *, current: Sequence[int] | None = None,
    lower: Bound = 1, upper: Bound = None,
) -> list[int]:
    """Micro-batches per aggregation w_i, proportional to speed, sum(w) = total_steps (Chao Eq. 10).

    With ``current`` (the w_i the times were measured at), ``compute_times``
    are each worker's time for its w_i micro-batches: Eq. 10 literally.
    Without it, they are seconds per micro-batch, so v_i = 1 / t_i.
    Integers via ``round_preserving_sum`` (Eq. 4 and 16: sum(w) = C constant);
    every worker accumulates at least ``lower`` micro-batches.
    """
    if current is None:
        if any(t <= 0 for t in compute_times):
            raise ValueError("compute times must be positive")
        current = [1] * len(compute_times)
    targets = task_allocation_targets(current, compute_times)
    return round_preserving_sum(targets, total_steps, lower, upper)


@dataclass
class AdaptiveAccumulation:
    """Chao et al. Algorithm 1 with its stop rule.

    Each ``update`` (once per epoch) recomputes w by Eq. 10 from the times
    measured at the current w. "Step 2 and step 3 could be cancelled when the
    ratio is not fluctuating": we stop re-allocating once the real-valued
    share w_i'/C changed by less than ``epsilon`` (relative, every worker)
    ``patience`` updates in a row (default: 5%, twice); the paper reports
    stability after 4-5 epochs. After that w stays fixed.
    """

    current: list[int]
    epsilon: float = 0.05
    patience: int = 2
    lower: int = 1
    stopped: bool = False
    _calm: int = 0
    _last_share: list[float] | None = None

    def update(self, compute_times: Sequence[float], *, upper: Bound = None) -> list[int]:
        """``upper``: per-worker caps on w_i (the samples of a cycle must fit in memory)."""
        if self.stopped:
            return list(self.current)
        total = sum(self.current)
        targets = task_allocation_targets(self.current, compute_times)
        share = [t / total for t in targets]
        prev = self._last_share or [w / total for w in self.current]
        change = max(abs(s - p) / p for s, p in zip(share, prev))
        self._last_share = share
        self._calm = self._calm + 1 if change < self.epsilon else 0
        if self._calm >= self.patience:
            self.stopped = True
        self.current = round_preserving_sum(targets, total, self.lower, upper)
        return list(self.current)

    def state_dict(self) -> dict[str, Any]:
        return {"current": list(self.current), "stopped": self.stopped, "calm": self._calm,
                "last_share": None if self._last_share is None else list(self._last_share)}

    @classmethod
    def from_state(cls, state: Mapping[str, Any], *, epsilon: float, patience: int, lower: int = 1
                   ) -> AdaptiveAccumulation:
        share = state["last_share"]
        return cls([int(w) for w in state["current"]], epsilon=epsilon, patience=patience, lower=lower,
                   stopped=bool(state["stopped"]), _calm=int(state["calm"]),
                   _last_share=None if share is None else [float(x) for x in share])


# ---------------------------------------------------------------------------
# Dynamic partitioning (DP-SGD, EDP-SGD)


def compute_power(samples: float, seconds: float) -> float:
    """DP-SGD Eq. 2: CP_m = |D_m| / X_m, samples processed per second of compute."""
    if seconds <= 0 or samples <= 0:
        raise ValueError("samples and seconds must be positive")
    return samples / seconds


def windowed_powers(history: Sequence[Sequence[float]], window: int = 1) -> list[float]:
    """Per-worker compute power from the last ``window`` epochs (mean).

    ``history[e][m]`` is worker m's CP in epoch e. DP-SGD Sec. 4.1: window 1
    (previous epoch) adapts fast; a longer history resists transient changes.
    """
    if not history or window < 1:
        raise ValueError("need at least one epoch of measurements and window >= 1")
    recent = np.asarray(history[-window:], dtype=float)
    return [float(x) for x in recent.mean(axis=0)]


def partition_sizes(powers: Sequence[float], num_samples: int, shard_size: int = 1) -> list[int]:
    """DP-SGD Algorithm 1, lines 8-10: |D_m| = CP_m / sum(CP) * |D|, in whole shards.

    Shards are counted with ``round_preserving_sum`` (every worker gets at
    least one shard when there are enough); the last, possibly partial, shard
    goes to the last worker with any, so the sizes sum to ``num_samples``.
    """
    if num_samples <= 0 or shard_size <= 0:
        raise ValueError("num_samples and shard_size must be positive")
    if not powers or any(p <= 0 for p in powers):
        raise ValueError(f"compute powers must be positive, got {list(powers)}")
    n_shards = -(-num_samples // shard_size)
    counts = round_preserving_sum(powers, n_shards, 1 if n_shards >= len(powers) else 0)
    sizes = [c * shard_size for c in counts]
    last = max(i for i, c in enumerate(counts) if c > 0)
    sizes[last] -= n_shards * shard_size - num_samples
    return sizes


def partition(
    num_samples: int, powers: Sequence[float], epoch: int, seed: int, *, shard_size: int = 1
) -> list[list[int]]:
    """DP-SGD Algorithm 1: disjoint index sets covering [0, num_samples), sized by power.

    Epoch 0 splits evenly (line 5: CP_m = 1/M) whatever ``powers`` say; later
    epochs use ``partition_sizes``. Shards are dealt out in a permutation
    seeded by (seed, epoch), the partial last shard last; indices are sorted.
    """
    m = len(powers)
    sizes_powers = [1.0] * m if epoch == 0 else list(powers)
    sizes = partition_sizes(sizes_powers, num_samples, shard_size)
    n_shards = -(-num_samples // shard_size)
    full = num_samples // shard_size
    order = list(np.random.default_rng([seed, epoch]).permutation(full)) + list(range(full, n_shards))
    out, pos = [], 0
    for size in sizes:
        k = -(-size // shard_size)
        idx: list[int] = []
        for s in order[pos:pos + k]:
            idx.extend(range(int(s) * shard_size, min((int(s) + 1) * shard_size, num_samples)))
        pos += k
        out.append(sorted(idx))
    return out
