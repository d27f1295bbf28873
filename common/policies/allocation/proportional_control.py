"""OmniLearn Eq. 6-8 / ACSOS Eq. 4-5: the proportional batch controller (pure, no I/O).

The ``pcontrol`` allocation policy (``pcontrol.py``) feeds it cycle times
and asks it for batches; this module is the math and its bookkeeping.
Constructor defaults are the papers' rules; the run's defaults are
``PControlParams`` (``pcontrol.py``), passed explicitly by the policy.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from hermes.common.policies.allocation._state import renamed
from hermes.common.policies.allocation.rounding import round_preserving_sum

DEADBAND_ORDERS = ("after-bounds", "before-bounds")
DEADBAND_REFERENCES = ("new", "old")


def deadband_passes(old: int, new: int, proposal: float, *, deadband: float, order: str = "after-bounds",
                    reference: str = "new") -> bool:
    """Whether a worker's batch change from ``old`` counts (is outside the dead-band).

    ``new`` is the bounded integer batch the step would set, ``proposal`` the
    unbounded Eq. 6 value b*. The papers disagree on what is compared:

    - order ``after-bounds`` (ours; ACSOS steps 3-4: bound, then check) tests
      ``new``; ``before-bounds`` (OmniLearn Alg. 1 lines 18-24: check b*, then
      clamp) tests ``proposal``;
    - reference ``new``: |b' - b| / b' >= deadband (OmniLearn Eq. 7);
      ``old``: |b' - b| / b >= deadband (ACSOS step 4, "max_k Δ(b_k)/b_k").
      ACSOS writes ">" but also "must be at least change by 5%": we take >=.

    A step that would not change the batch never counts.
    """
    if new == old:
        return False
    target = new if order == "after-bounds" else proposal
    return abs(target - old) / (target if reference == "new" else old) >= deadband


class PControlParams(BaseModel):
    """The run config's ``pcontrol`` section: the controller's settings for a run (ours where they differ from the papers)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    deadband: float = Field(default=0.1, ge=0.0, lt=1.0,
                            description="Dead-band: a batch change counts only if |b' - b| / b' >= this (OmniLearn Eq. 7).")
    alpha: float = Field(default=0.3, gt=0.0, le=1.0, description="EWMA weight of the newest cycle time (ACSOS smoothing).")
    interval: Literal["epoch", "round"] = Field(
        default="epoch", description="When to step: 'epoch' after each data epoch (OmniLearn), 'round' whenever every "
                                     "worker has new measurements (ACSOS).")
    # Where cycle times jitter by tens of percent (a shared CPU), restarting
    # left each step to 2-3 noisy cycles (measured: 400+ adjustments in 50 s at HL8).
    carry_smoothing: bool = Field(
        default=True, description="Keep the smoothed time across a batch change, rescaled by b_new/b_old; false "
                                  "restarts it (ACSOS).")
    throughput_cap: bool = Field(
        default=True, description="ACSOS throughput-drop rule: b_max <- b0 when throughput fell after b0 -> b.")
    # Cycle times on a shared CPU jitter by 10-30%; ACSOS Fig. 5's memory cliff is far steeper.
    drop_margin: float = Field(
        default=0.25, ge=0.0, lt=1.0, description="A throughput fall within this share is noise, not a drop "
                                                   "(0 = the paper's rule).")
    drop_cap_updates: int = Field(
        default=10, ge=0, description="Control steps after which a throughput-drop cap is lifted (0 = never, the paper's rule).")
    # The papers' rules, each one switch away (docs/papers.md, "Deviations from the papers").
    deadband_order: Literal["after-bounds", "before-bounds"] = Field(
        default="after-bounds", description="Dead-band tested on the bounded batch (ours, ACSOS) or, 'before-bounds', "
                                            "on the unbounded Eq. 6 value, then clamped (OmniLearn Alg. 1).")
    deadband_reference: Literal["new", "old"] = Field(
        default="new", description="Dead-band relative to the new batch (OmniLearn Eq. 7) or, 'old', to the old one "
                                   "(ACSOS step 4).")
    global_rule: Literal["proportional", "uniform"] = Field(
        default="proportional", description="Fixed global batch by rescaling proportionally, b_k = B*X_k/sum(X) "
                                            "(ours), or 'uniform': OmniLearn Eq. 8 literally, b_k' - dB/K.")
    global_batch: Literal["fixed", "free"] | None = Field(
        default=None, description="Global batch rule (OmniLearn Eq. 8): 'fixed' keeps sum(b) = K*b, 'free' does not; "
                                  "unset: fixed under a barrier, free for asynchronous pushes.")


@dataclass
class _WorkerState:
    batch_size: int
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

    Its settings are the run config's ``pcontrol`` section (``PControlParams``,
    ours where we differ from the papers); the papers' rules are the presets'
    values (no drop margin, smoothing restarts, caps never lifted).

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

    batch_sizes: Mapping[str, int]
    params: PControlParams
    b_min: int
    b_max: int
    global_batch: int | None = None  # B (OmniLearn Eq. 8), or None: no global rule
    workers: dict[str, _WorkerState] = field(init=False)
    adjustments: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        if not 1 <= self.b_min <= self.b_max:
            raise ValueError(f"need 1 <= b_min <= b_max, got ({self.b_min}, {self.b_max})")
        self.workers = {}
        for w, batch_size in self.batch_sizes.items():
            self.add_worker(w, batch_size)

    # The two settings the step reads that the parameters do not hold as they are.
    @property
    def drop_margin(self) -> float:
        # Without the throughput cap: a margin no fall can exceed.
        return self.params.drop_margin if self.params.throughput_cap else 1.0

    @property
    def drop_cap_updates(self) -> int | None:
        return self.params.drop_cap_updates or None  # 0: a cap is never lifted (the paper's rule)

    # ---- membership and limits -------------------------------------------

    def add_worker(self, worker: str, batch_size: int) -> None:
        self.workers[worker] = _WorkerState(batch_size=int(batch_size), hard_max=self.b_max)

    def remove_worker(self, worker: str) -> None:
        self.workers.pop(worker, None)

    def set_b_max(self, worker: str, b_max: int) -> None:
        """Lower a worker's b_max (memory model, OmniLearn Eq. 9); never below b_min."""
        st = self.workers[worker]
        st.hard_max = max(self.b_min, min(st.hard_max, int(b_max)))

    def batch_size(self, worker: str) -> int:
        return self.workers[worker].batch_size

    def b_max_of(self, worker: str) -> int:
        return self.workers[worker].b_max

    # ---- measurements ----------------------------------------------------

    def observe(self, worker: str, seconds: float) -> None:
        """One iteration's compute time at the worker's current batch."""
        if not (math.isfinite(seconds) and seconds > 0):
            raise ValueError(f"compute time must be positive, got {seconds!r}")
        st = self.workers[worker]
        st.ewma = seconds if st.ewma is None else self.params.alpha * seconds + (1 - self.params.alpha) * st.ewma

    def smoothed(self, worker: str) -> float | None:
        return self.workers[worker].ewma

    # ---- checkpoints -----------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Plain JSON-able: per-worker batch, caps, smoothed time and throughput-drop memory."""
        workers = {w: {"batch_size": st.batch_size, "hard_max": st.hard_max, "ewma": st.ewma,
                       "before_increase": None if st.before_increase is None else list(st.before_increase),
                       "drop_cap": st.drop_cap, "drop_cap_age": st.drop_cap_age}
                   for w, st in self.workers.items()}
        return {"workers": workers, "global_batch": self.global_batch, "adjustments": self.adjustments}

    def restored(self, state: Mapping[str, Any]) -> ProportionalController:
        """A controller with these settings in the saved state (a new object: a bad state leaves this one alone)."""
        out = dataclasses.replace(self, batch_sizes={})
        for w, st in state["workers"].items():
            before = st["before_increase"]
            out.workers[str(w)] = _WorkerState(
                batch_size=int(renamed(st, "batch_size", "batch")), hard_max=int(st["hard_max"]),
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
            return {w: self.workers[w].batch_size for w in ws}
        st = {w: self.workers[w] for w in ws}
        # Checked above: every worker has a smoothed time.
        t: dict[str, float] = {w: float(st[w].ewma or 0.0) for w in ws}
        x = {w: st[w].batch_size / t[w] for w in ws}  # throughput X_k, OmniLearn Eq. 6a
        # ACSOS throughput-drop rule: b_max <- b0 when X fell after b0 -> b.
        # A fall within ``drop_margin`` is measurement noise: one noisy cycle
        # on a shared machine would otherwise cap a fast worker for good.
        for w in ws:
            if st[w].drop_cap is not None:
                st[w].drop_cap_age += 1
                if self.drop_cap_updates is not None and st[w].drop_cap_age > self.drop_cap_updates:
                    st[w].drop_cap = None
            before = st[w].before_increase
            if before is not None:
                b0, x0 = before
                if x[w] < x0 * (1.0 - self.drop_margin):
                    st[w].drop_cap, st[w].drop_cap_age = max(self.b_min, min(st[w].b_max, b0)), 0
                st[w].before_increase = None
        t_bar = sum(t.values()) / len(ws)
        # OmniLearn Eq. 6b / ACSOS Eq. 4-5: b' = b - X*(t - t_bar) = X * t_bar.
        proposal = {w: st[w].batch_size - x[w] * (t[w] - t_bar) for w in ws}
        lo = [self.b_min] * len(ws)
        hi = [st[w].b_max for w in ws]
        old = {w: st[w].batch_size for w in ws}
        if self.global_batch is None:
            new = {w: int(min(max(math.floor(proposal[w] + 0.5), self.b_min), st[w].b_max)) for w in ws}
        else:
            new = dict(zip(ws, self._global(ws, [proposal[w] for w in ws], self.global_batch, lo, hi)))
        # Dead-band, OmniLearn Eq. 7 (what is compared with what: deadband_passes).
        moving = [w for w in ws if deadband_passes(old[w], new[w], proposal[w], deadband=self.params.deadband,
                                                   order=self.params.deadband_order, reference=self.params.deadband_reference)]
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
            st[w].batch_size = new[w]
            if self.params.carry_smoothing:
                # The prior at the new batch is the old estimate scaled by the
                # proportional model (t ∝ b); the new batch's cycles then blend in.
                st[w].ewma = t[w] * new[w] / old[w]
            else:
                st[w].ewma = None  # ACSOS: smoothing restarts at the new batch
        if changed:
            self.adjustments += 1
        return {w: st[w].batch_size for w in ws}

    def _global(self, ws: list[str], proposal: list[float], total: int, lo: list[int], hi: list[int]) -> list[int]:
        # Caps lowered by the throughput-drop rule (or memory) may no longer
        # hold B together: then every worker runs at its cap, the most the
        # cluster can do, rather than failing the step.
        total = min(total, sum(hi))
        if self.params.global_rule == "uniform":
            # OmniLearn Eq. 8 literally: b_k <- b_k' - dB/K, dB = sum(b') - K*b.
            shift = (sum(proposal) - total) / len(ws)
            proposal = [max(p - shift, 0.0) for p in proposal]
        # "proportionately reducing adjusted batches" (OmniLearn Sec. III-B1):
        # b_k = B * X_k / sum(X), exact integers within bounds.
        return round_preserving_sum(proposal, total, lo, hi)
