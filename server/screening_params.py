"""The bounds of update screening, a section of the server settings.

Apart from ``engine.screening`` (which needs torch) so that the server's
settings, and with them every start-up check of ``hermes-server``, load
without importing torch: a mistake is reported in a second, not after it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from hermes.server.quarantine_params import QuarantineSettings


class ScreeningSettings(BaseModel):
    """The bounds of update screening (server settings ``screening_*``, CLI ``--screening-*``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = True
    # Honest testbed runs at HL8 stayed under 3x the median for most presets, but
    # omnilearn-asp (lr scaled by batches of 11..85) pushed an honest 15x (1.61 vs
    # median 0.105, 2026-11-23): 32 leaves 2x margin over that; a 1000x update is still refused.
    norm_factor: float = Field(default=32.0, gt=1.0)
    window: int = Field(default=64, ge=1, le=100_000)
    min_history: int = Field(default=4, ge=1)
    bootstrap_factor: float = Field(default=4.0, gt=0.0)
    loss_factor: float = Field(default=4.0, gt=1.0)
    # The evidence score (server/engine/quarantine.py) at which a worker is quarantined; 0: never.
    quarantine_after: int = Field(default=5, ge=0)
    quarantine: QuarantineSettings = Field(default_factory=QuarantineSettings)
    # Direction (issue 29, engine.direction): cos(update, coordinate-wise median of the other workers'
    # latest accepted updates) must be >= min_cosine once min_workers others have one.
    direction: bool = True
    # The reference: "descent", -grad of the loss probe at the current model (Zeno++'s server
    # gradient; an honest correction of an overshot model agrees with it), or "consensus", the
    # median of the other workers' latest accepted updates (no server data needed; honest digits
    # asp steps after an overshoot were at cosine -0.5 with it, 2026-11-27).
    reference: Literal["descent", "consensus"] = "descent"
    # The lowest cosine at direction_norm_factor x the median norm; at r x the median the bound is
    # min_cosine x direction_norm_factor / r (a bigger update must agree more).
    min_cosine: float = Field(default=-0.5, ge=-1.0, le=0.0)
    min_workers: int = Field(default=2, ge=1)
    # Only updates above this x the median norm are judged by direction and effect: smaller ones
    # move the model no more than a few honest steps (honest asp reached 4.5x, 2026-11-27).
    direction_norm_factor: float = Field(default=4.0, ge=0.0)
    # Clip (issue 29): an update above direction_norm_factor x the median that passes is folded
    # at that norm (its weight scaled), so a scaled attack counts as a few honest steps at most.
    clip: bool = True
    # Effect (issue 29): the probe loss of w + update at most (1 + effect_margin) x that of w.
    effect: bool = True
    effect_margin: float = Field(default=0.5, gt=0.0)
    # ... plus this much (nats): near convergence the probe loss is ~0.01-0.08 and an honest hermes
    # update at 7.8x the median moved it 0.081 -> 0.143 (2026-11-27); attacks moved it by 0.5-1.3.
    effect_slack: float = Field(default=0.1, ge=0.0)
    # A large update that fails the direction or the effect test is refused only above this x the
    # median norm, and only for its direction (the effect's verdict when direction is off); any other
    # failure is folded at the median norm (down-weighted). Honest stale asp / fedasync updates at
    # 4.0-5.2x raised the probe loss or pointed against the descent (2026-11-27); the sign flips at
    # k >= 10 are refused. 0: every direction failure is refused (before issue 29's false-refusal fix).
    downweight_below: float = Field(default=8.0, ge=0.0)
    # An effect failure is evidence only when the update also points uphill: its cosine with the
    # reference below this. Near 0 the first-order change of the loss is nil and a rise is curvature:
    # edp-sgd's batch-5 worker was refused at 9.4x, cosine -0.016 (seed 1, 2026-11-27); the sign flips
    # of the attack tests sit far below it. 0.0: any negative cosine counts (before this rule).
    uphill_below: float = Field(default=-0.05, ge=-1.0, le=0.0)
    # An uphill update that failed the effect test is refused only when folding it down-weighted (at the
    # expected norm) would still fail it: down-weighting contains anything else. An honest hermes update
    # was refused at 8.38x, probe loss 0.707 -> 1.23 clipped to 4x (matrix, 2026-11-27); the fedbuff
    # k = 10 flips raised it 0.30 -> 1.94. False: refused on the clipped verdict, as before.
    refuse_uncontained_only: bool = True
    # Updates between this and direction_norm_factor x their expected norm have their direction measured too:
    # one whose cosine is below uphill_below is down-weighted (folded at the expected norm), never refused,
    # and the rest fold as they are. The sign flip at k = 3 (every 8 honest pushes, under the 4x gate) was
    # folded whole, cancelling ~3 of those 8 steps (asp, 1.51x the honest time, 2026-11-27). 0: off.
    uphill_from: float = Field(default=2.0, ge=0.0)
    direction_window: int = Field(default=32, ge=1, le=10_000)
    # Work-aware norm scale (issue 29, engine.claims.work_scale): an update is judged against the median
    # norm x max(1, its assignment's lr x steps / batch over the median of the accepted updates'), at most
    # work_scale_max; updates whose assignment the server does not know (no id on the cycle report, blend
    # presets) at x 1. edp-sgd's partition cut one worker's batch to 5-6 and its honest updates reached
    # 14-70x the batch-32 median (2026-11-27). False: the median norm alone, as before.
    work_scale: bool = True
    work_scale_max: float = Field(default=16.0, ge=1.0)
    # Blend presets (hermes, fedasync; issue 29): a stale update's step (w0 + G) - w also undoes what the
    # model moved since its base, so it is judged against the median plus that distance (the path length of
    # the folds since, from the later of its base and the worker's own previous push: a base claimed older
    # than that buys nothing). An honest hermes update at staleness 5 was refused at 14.3x the median,
    # cosine -0.205, under load (2026-11-27). False: the median alone, as before.
    stale_drift: bool = True
    sketch: int = Field(default=65_536, ge=16, le=1 << 24)
    # Claims (issue 29, engine.claims): samples and dss at most the assigned cycle_samples; cycle
    # seconds at least this fraction of the wall time from the hand-out of the assignment the report
    # names (or the worker's previous push reply, if later) to the push that carries it, and the speed
    # they imply at most power_factor x the median of the other workers' (HL8 fleets differ by 8x).
    claims: bool = True
    # The elapsed-time floor (0: off). Reports naming no assignment (older agents) have none.
    min_compute_fraction: float = Field(default=0.25, ge=0.0, le=1.0)
    power_factor: float = Field(default=8.0, gt=1.0)
    max_samples_unassigned: int = Field(default=4096, ge=1)
    # Cycle seconds are clamped only when off their bound by more than this factor (noise, not a lie).
    speed_tolerance: float = Field(default=2.0, ge=1.0)
