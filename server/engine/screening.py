"""Update screening: every push is checked before anything is folded, on every preset.

An authenticated worker can still send a poisoned or broken update; one such
update folded whole under ``asp`` took test accuracy from 0.925 to 0.142, and
two pushes of one 3e38 element made the model Inf (issue 15). The checks:

* **Norm against recent accepted updates.** ``||G|| <= norm_factor x median``
  of the last ``window`` accepted norms. The median is the robust statistic
  of the norm-bounding defences (Sun et al. 2019, "Can you really backdoor
  federated learning?", norm clipping; Flower's
  ``flwr.server.strategy.dp_adaptive_clipping`` adapts its bound to a
  quantile of the clients' norms the same way): a minority of attackers cannot
  move it, so a slowly growing stream of scaled updates hits the bound once it
  is ``norm_factor`` times the honest scale.
* **At the scale of its work** (issue 29, no honest work thrown away): the median is scaled up for an
  update whose assignment the server handed out with more expected movement than the accepted ones'
  (``work_scale``: lr x steps / batch, engine.claims.work_scale; at most ``work_scale_max``), and, for
  blends, by the path length the model moved since a stale update's base (``stale_drift``: its step
  (w0 + G) - w also undoes that; counted from the worker's own previous push, never from an older
  claimed base). Updates of an unknown assignment are judged at the median, as before.
* **The first pushes** (fewer than ``min_history`` accepted norms) are not
  trusted: their norm is bounded by ``bootstrap_factor x ||w||``, the model's
  own scale, and where the preset scores candidates (Hermes' loss probe) the
  candidate's loss must be finite and at most ``loss_factor`` times the
  global model's. Hermes' first blend has weight 1 whatever the loss, so a
  poisoned first push used to become the model.
* **Non-finite probe loss** is refused on every push (it made the blend raise).
* **Large updates** (norm > ``direction_norm_factor`` x the median, issue 29; docs/security-screening.md):
  *direction*, the cosine with the server's descent direction (the loss probe's -grad at the current
  model, Zeno++) or with the consensus of the other workers' accepted updates must be at least
  ``min_cosine x direction_norm_factor / ratio``; *effect*, the probe loss of the model the fold
  would make must not rise beyond ``effect_margin``; *clip*, one that passes folds at
  ``direction_norm_factor`` x the median (its weight scaled).
* **Quarantine** (engine/quarantine.py): refusals spread over time and cycles
  quarantine a worker; its later pushes are screened but not folded until
  it passes probation or the operator releases it (0 = never).

A refusal is a value, not an exception: the engine passes the push to the
sync strategy with no payload, so barriers are not held by a refused
worker, and answers ``rejected`` with the reason (the agent counts it and goes on).
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import math
import statistics
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from hermes.common.clock import SYSTEM_CLOCK, Clock
from hermes.common.wire import Payload
from hermes.server.engine.direction import DirectionReference, cosine
from hermes.server.engine.offload import offload, payload_bytes
from hermes.server.engine.quarantine import Quarantine
from hermes.server.screening_params import ScreeningSettings as ScreeningSettings  # torch-free; re-exported

if TYPE_CHECKING:
    from hermes.server.engine.telemetry import Telemetry
    from hermes.server.lossprobe import LossProbe
    from hermes.server.registry import WorkerRecord
    from hermes.server.state import ModelState

log = logging.getLogger(__name__)

# Elements per norm block: bounds the fp32 temporary of a half-precision update.
_BLOCK = 1 << 20


def update_norm(payload: Payload) -> float:
    """L2 norm of an update, inf when it overflows float32 (an element near 3e38 does); cached on
    the payload, whose validation already computed it."""
    return payload.norm


class Screening:
    def __init__(self, settings: ScreeningSettings, state: ModelState, telemetry: Telemetry,
                 reference_loss: Callable[[], float] | None = None, *, blend: bool = False,
                 clock: Clock = SYSTEM_CLOCK, probe: LossProbe | None = None) -> None:
        self.settings = settings
        self.state = state
        self.telemetry = telemetry
        # The global model's probe loss, where the preset scores candidates (hermes).
        self.reference_loss = reference_loss
        # Blend presets (hermes, fedasync) push G = model - w0, not a step: what the fold
        # moves the model by is (w0 + G) - w, so that is the norm screened. ||G|| alone let a
        # worker pushing G = 0 mix the model back towards w0 under fedasync (no loss probe).
        self.blend = blend
        # The loss probe (the rule's, else the screening's own): the descent direction and the effect test.
        self.probe = probe
        # The fold's scale of updates judged large and clipped or down-weighted, by payload.
        self._scale: dict[int, float] = {}
        self.clipped = 0
        self.downweighted = 0
        self.accepted: deque[float] = deque(maxlen=settings.window)
        self.refusals: dict[str, int] = {}
        self.quarantine = Quarantine(settings.quarantine_after, settings.quarantine, telemetry, clock=clock)
        self._model_norm: tuple[int, float] | None = None
        self.direction = DirectionReference(state.numel, window=settings.direction_window, sketch=settings.sketch,
                                            min_workers=settings.min_workers)
        # The lowest cosine of an accepted update, and how many were measured (the false-refusal table's margin).
        self.min_accepted_cosine: float | None = None
        self.cosines_measured = 0
        # Claims clamped (engine.claims), reported beside the refusals; set by the engine.
        self.claims_clamped: Callable[[], dict[str, int]] | None = None
        # The elapsed-time floor's honest margin (engine.claims: the lowest claimed compute / wall time of a
        # window, and how many windows were closed); set by the engine.
        self.claims_windows: Callable[[], dict[str, Any]] | None = None
        # The work scale of the update a worker is pushing now (engine.claims.Claims.take_scale); set by the engine.
        self.work_scale: Callable[[str], float | None] | None = None
        # A worker's expected fold weight over a typical worker's, where the rule weighs by compute power; set by the engine.
        self.fold_share: Callable[[str], float | None] | None = None
        # The work scales of recently accepted updates whose assignment is known (their median is x 1).
        self.accepted_scales: deque[float] = deque(maxlen=settings.window)
        self.work_scaled = 0  # updates judged at a work scale above 1
        # Blends: the model's path length by version, (version, cumulative length), and the last model measured.
        self._path: deque[tuple[int, float]] = deque(maxlen=4096)
        self._path_model: tuple[int, torch.Tensor] | None = None
        # The model version at each worker's latest screened push (the newest base it can have had since).
        self._pushed_at: dict[str, int] = {}
        self.drift_allowed = 0  # stale blends judged with a drift allowance

    def _step_sketch(self, payload: Payload) -> torch.Tensor:
        """What the fold would move the model by, on the direction reference's coordinates."""
        if self.blend:
            _, current = self.state.snapshot()
            return self.direction.sketch(self.state.candidate(payload) - current)
        step = torch.empty(payload.numel, dtype=torch.float32)
        for off, piece in payload.fp32_pieces():
            step[off:off + piece.numel()] = piece
        return self.direction.sketch(step)

    def _model_scale(self) -> float:
        cached = self._model_norm
        if cached is None or cached[0] != self.state.version:
            version, flat = self.state.snapshot()
            cached = self._model_norm = (version, float(torch.linalg.vector_norm(flat)))
        return cached[1]

    async def screen(self, worker: WorkerRecord, payload: Payload, candidate_loss: float | None,
                     staleness: int | None = None) -> tuple[str | None, float]:
        """(None, scale) when the update may be folded at ``scale`` x its weight, else (the refusal's reason, 0).

        ``staleness`` (model versions since the update's base) is only recorded in the events."""
        if not self.settings.enabled:
            return None, 1.0
        scale = 1.0
        refusal = await self._screen(worker, payload, candidate_loss, staleness)
        clip = self._scale.pop(id(payload), None)  # popped either way: ids are reused once a payload is freed
        if refusal is None and clip is not None:
            scale = clip
            self.clipped += 1
        return refusal, (scale if refusal is None else 0.0)

    async def _screen(self, worker: WorkerRecord, payload: Payload, candidate_loss: float | None,
                      staleness: int | None) -> str | None:
        s = self.settings
        if candidate_loss is not None and not math.isfinite(candidate_loss):
            return self._refuse(worker, "loss", f"candidate loss {candidate_loss} is not finite")
        if self.blend:
            norm = await offload(payload_bytes(payload), self.state.blend_step_norm, payload)
        else:
            norm = await offload(payload_bytes(payload), update_norm, payload)
        if not math.isfinite(norm):
            return self._refuse(worker, "norm", "norm overflows float32")
        history = [n for n in self.accepted if n > 0.0]
        work = self.work_scale(worker.id) if self.work_scale is not None else None
        relative = self._relative_work(work, self.fold_share(worker.id) if self.fold_share is not None else None)
        drift = 0.0
        if self.blend and s.stale_drift:
            drift = await offload(self.state.numel * 8, self._drift, worker.id,
                                  None if staleness is None else self.state.version - staleness)
        # Once: the norm test and the expected norm below read the same list (issue 31: a push's Python).
        median = statistics.median(history) if history else 0.0
        if len(history) >= s.min_history:
            if norm > s.norm_factor * (median * relative + drift):
                at = "" if relative == 1.0 else f" × work scale {relative:.3g}"
                at += "" if drift == 0.0 else f" + drift {drift:.3g} since its base"
                return self._refuse(worker, "norm",
                                    f"norm {norm:.3g} > {s.norm_factor:g} × median {median:.3g}{at}")
        else:
            scale = await offload(self.state.numel * 4, self._model_scale)
            if norm > s.bootstrap_factor * scale:
                return self._refuse(worker, "bootstrap_norm", f"norm {norm:.3g} > {s.bootstrap_factor:g} × "
                                    f"model norm {scale:.3g} (first updates of the run)")
            if candidate_loss is not None and self.reference_loss is not None:
                reference = await offload(self.state.numel * 4, self.reference_loss)
                if math.isfinite(reference) and candidate_loss > s.loss_factor * reference:
                    return self._refuse(worker, "loss", f"candidate loss {candidate_loss:.3g} > {s.loss_factor:g} × "
                                        f"global loss {reference:.3g} (first updates of the run)")
        sketch = None
        # The expected norm of an update of this assignment's shape: the median x its relative work scale.
        # A stale blend's, plus the distance the model moved since its base (it undoes that too).
        typical = median * relative + drift if history else None
        # Only updates bigger than direction_norm_factor x the median are judged by direction and
        # effect: honest asp steps after an overshoot sat at cosine -0.5 with the consensus and
        # -0.27..-0.53 with the server's descent direction at 2.6-4.5x the median (digits,
        # 2026-11-27); a smaller update moves the model no more than a few honest steps.
        ratio = None if typical is None or norm <= 0.0 else norm / typical
        large = ratio is not None and ratio > s.direction_norm_factor
        # Between uphill_from and the gate: only the direction is measured, and an uphill update down-weighted.
        band = not large and ratio is not None and 0.0 < s.uphill_from < ratio
        direction_failed: str | None = None
        direction_measured = False
        uphill = False  # a cosine below uphill_below: to first order the update raises the probe loss
        effect_failed: str | None = None
        effect: tuple[float, float] | None = None  # the probe loss before, and what the effect test allows
        # The consensus keeps every accepted update's sketch; the descent reference needs one only for
        # an update it judges (the sketch cost ~1.5 ms of every push on a 1M-parameter model, 2026-11-27).
        keeps_history = s.reference != "descent" or self.probe is None
        if s.direction and norm > 0.0 and (large or band or keeps_history):
            sketch = await offload(payload_bytes(payload) * 2, self._step_sketch, payload)
            agreement = await self._cosine(worker.id, sketch) if large or band else None
            if agreement is not None and band:
                assert ratio is not None
                # Under the gate an update moves the model by a few honest steps at most, but a flip there
                # still undoes them: k = 3 every 8 honest pushes cancels ~3 of the 8 (issue 29). Folded at
                # the expected norm it undoes one; too little evidence to refuse (honest asp reached cosine
                # -0.5 at 4.5x after an overshoot, 2026-11-27), so it is down-weighted only.
                downhill = agreement >= s.uphill_below
                self.telemetry.emit("direction_tested", worker=worker.id, cosine=round(agreement, 4),
                                    norm_ratio=round(ratio, 3), accepted=downhill, staleness=staleness,
                                    work_scale=round(relative, 3), band=True)
                if not downhill:
                    self.downweighted += 1
                    self.telemetry.emit("update_downweighted", worker=worker.id, norm_ratio=round(ratio, 3),
                                        direction=(f"cosine {agreement:.3f} with the {s.reference} direction < "
                                                   f"{s.uphill_below:g} at {ratio:.3g} × the median norm"),
                                        effect=None, staleness=staleness)
                    self._scale[id(payload)] = 1.0 / ratio
            elif agreement is not None:
                assert ratio is not None
                direction_measured = True
                # The bar rises with the update's size, as Zeno++'s score <g, u> - rho ||u||^2
                # (Xie et al. 2020, Eq. 3) does: min_cosine at direction_norm_factor x the median,
                # a tenth of it at ten times that.
                bound = s.min_cosine * s.direction_norm_factor / ratio
                ok = agreement >= bound
                uphill = agreement < s.uphill_below
                self.telemetry.emit("direction_tested", worker=worker.id, cosine=round(agreement, 4),
                                    norm_ratio=round(ratio, 3), accepted=ok, staleness=staleness,
                                    work_scale=round(relative, 3))
                if not ok:
                    direction_failed = (f"cosine {agreement:.3f} with the {s.reference} direction "
                                        f"< {bound:.3g} at {ratio:.3g} × the median norm")
                else:
                    self.cosines_measured += 1
                    if self.min_accepted_cosine is None or agreement < self.min_accepted_cosine:
                        self.min_accepted_cosine = agreement
        if s.effect and large and self.probe is not None:
            # The loss probe that protects hermes, for every preset (issue 29): the model the fold
            # would make (the update clipped, at full weight) must not raise the probe loss beyond
            # effect_margin. Measured even when the direction failed: the event is the evidence record.
            assert ratio is not None
            clip = s.direction_norm_factor / ratio if s.clip else 1.0
            after = await asyncio.to_thread(self._loss_after, payload, clip)
            _, before = await asyncio.to_thread(self.probe.global_loss)
            bound = (1.0 + s.effect_margin) * before + s.effect_slack
            effect = (before, bound)
            ok = math.isfinite(after) and after <= bound
            self.telemetry.emit("effect_tested", worker=worker.id, loss_before=round(before, 5),
                                loss_after=round(after, 5) if math.isfinite(after) else None,
                                norm_ratio=round(ratio, 3), accepted=ok, staleness=staleness,
                                work_scale=round(relative, 3))
            if not ok:
                effect_failed = (f"probe loss {after:.3g} after the update > {1.0 + s.effect_margin:g} × "
                                 f"{before:.3g} + {s.effect_slack:g} before, at {ratio:.3g} × the median norm")
                if (s.refuse_uncontained_only and uphill and direction_failed is None
                        and ratio > s.downweight_below):
                    # Refusing is only worth it when down-weighting would not contain the harm: the model
                    # this update makes folded at the expected norm (what a down-weight folds) must fail
                    # the same bound. An honest, stale hermes step at 8.38x raised the clipped probe
                    # loss 0.707 -> 1.23 (matrix, 2026-11-27); at the median norm it moves it a quarter of that.
                    if await self._contained(worker, payload, ratio, before, bound, staleness, relative):
                        uphill = False  # not evidence: a down-weight folds it harmlessly
        if direction_failed is not None or effect_failed is not None:
            assert ratio is not None
            # Refused only on evidence (issue 29: no honest work thrown away): an update above
            # downweight_below x the median whose direction is against the reference, or that raises
            # the probe loss while pointing uphill (the effect's verdict alone when direction is off or
            # unmeasured). Anything else that failed is folded at the median norm,
            # where it weighs no more than an update too small to be judged at all (every update
            # under direction_norm_factor x the median is folded as it is), so refusing it would
            # protect nothing. Honest asp at seed 3 pushed 5.2x at cosine -0.57 during the first
            # seconds' oscillation, and edp-sgd's large-partition worker 8x+ updates that agreed
            # with the descent but raised the probe loss (2026-11-27, docs/security-screening.md).
            if not direction_measured:
                # The effect's verdict alone refuses only where the operator switched the direction test
                # off; with it on but unmeasured (a zero reference), a raised probe loss is no evidence
                # of intent (issue 29: honest large steps raise it too), so it is down-weighted.
                evidence = effect_failed if not s.direction else None
            else:
                evidence = direction_failed or (effect_failed if uphill else None)
                if (direction_failed is not None and s.refuse_uncontained_only and effect is not None
                        and 0 < s.stale_contain_from <= (staleness or 0) and ratio > s.downweight_below
                        and await self._contained(worker, payload, ratio, *effect, staleness, relative)):
                    # Stale: the cosine was taken against where the model is now, not where the update
                    # started; refused only if a down-weight would not contain it either.
                    evidence = None
            if evidence is not None and ratio > s.downweight_below:
                return self._refuse(worker, "direction" if direction_failed is not None else "effect", evidence)
            self.downweighted += 1
            self.telemetry.emit("update_downweighted", worker=worker.id, norm_ratio=round(ratio, 3),
                                direction=direction_failed, effect=effect_failed, staleness=staleness)
            self._scale[id(payload)] = 1.0 / ratio
        if large and s.clip and id(payload) not in self._scale:
            # Clipped to direction_norm_factor x the median, not refused (Sun et al. 2019's norm
            # clipping, the bound adaptive as in Andrew et al. 2021): an honest correction still
            # counts, a scaled attack counts as no more than a few honest steps.
            assert ratio is not None
            self._scale[id(payload)] = s.direction_norm_factor / ratio
        held = self.quarantine.accepted(worker)
        if held is not None:  # on probation: screened and passed, not folded
            self._scale.pop(id(payload), None)
            return self._refuse(worker, "quarantined", held)
        # Zero updates carry no scale: kept out so a run of them cannot pull the median to 0.
        if norm > 0.0:
            self.accepted.append(norm)
            if work is not None and s.work_scale and not self.blend:
                self.accepted_scales.append(work)
        if sketch is not None:
            self.direction.accept(worker.id, sketch)
        return None

    def _drift(self, worker_id: str, base: int | None) -> float:
        """How far the model moved (path length of the folds) since the later of ``base`` and the version at
        this worker's previous push; 0 for its first push. By the triangle inequality ||w_base - w|| is at
        most that, so an honest stale blend's step is at most the median plus it."""
        version, model = self.state.snapshot()
        if self._path_model is None:
            self._path.append((version, 0.0))
        elif self._path_model[0] != version:
            total = self._path[-1][1] + float(torch.linalg.vector_norm(model - self._path_model[1]))
            self._path.append((version, total))
        self._path_model = (version, model)
        since = self._pushed_at.get(worker_id)
        self._pushed_at[worker_id] = version
        if since is None or base is None:
            return 0.0
        since = max(since, base)
        # The first record at or after ``since`` (none older is kept: the allowance can only shrink).
        i = bisect.bisect_left(self._path, (since, -math.inf))
        if i >= len(self._path):
            return 0.0
        drift = self._path[-1][1] - self._path[i][1]
        if drift > 0.0:
            self.drift_allowed += 1
        return drift

    def _relative_work(self, work: float | None, share: float | None = None) -> float:
        """max(1, this update's work scale over the median of the accepted ones'), at most work_scale_max;
        1 where the shape is unknown or not the step's (blends: G spans many cycles). Times 1 / ``share``
        (at most work_scale_max) for an update the rule folds at ``share`` < 1 of a typical worker's weight."""
        s = self.settings
        relative = 1.0
        if s.work_scale and not self.blend and work is not None and self.accepted_scales:
            relative = min(s.work_scale_max, max(1.0, work / statistics.median(self.accepted_scales)))
        if s.work_scale and share is not None and 0.0 < share < 1.0:
            # The power rule (EDP-SGD) folds it at CP_i / sum(CP): an update at 1/8 of a typical weight moves
            # the model 1/8 as far. edp-sgd's slowest worker, its batch cut to 4 beside a 94 (fast worker
            # unclamped, issue 29), pushed honest 16-sample updates at 145-240x the median norm, weight 0.03,
            # probe loss unchanged, and was refused by norm (2026-11-27). Its weight is the claims' bounded power.
            relative *= min(s.work_scale_max, 1.0 / share)
        if relative > 1.0:
            self.work_scaled += 1
        return relative

    async def _contained(self, worker: WorkerRecord, payload: Payload, ratio: float, before: float, bound: float,
                         staleness: int | None, relative: float) -> bool:
        """Whether the model this update makes folded at the expected norm (a down-weight) passes the effect bound."""
        at_median = await asyncio.to_thread(self._loss_after, payload, 1.0 / ratio)
        contained = math.isfinite(at_median) and at_median <= bound
        self.telemetry.emit("effect_tested", worker=worker.id, loss_before=round(before, 5),
                            loss_after=round(at_median, 5) if math.isfinite(at_median) else None,
                            norm_ratio=1.0, accepted=contained, staleness=staleness,
                            work_scale=round(relative, 3), at="median")
        return contained

    def _loss_after(self, payload: Payload, clip: float) -> float:
        """Probe loss of the model the fold would make at full weight: w + clip x step."""
        assert self.probe is not None
        _, current = self.state.snapshot()
        full = self.state.candidate(payload, from_current=not self.blend)
        return self.probe.loss_of(current + clip * (full - current))

    async def _cosine(self, worker_id: str, sketch: torch.Tensor) -> float | None:
        """The update's agreement with the reference: the server's descent direction, or the consensus."""
        if self.settings.reference == "descent" and self.probe is not None:
            return cosine(sketch, self.direction.sketch(await offload(self.state.numel * 8, self.probe.descent)))
        return self.direction.cosine(worker_id, sketch)

    def _refuse(self, worker: WorkerRecord, kind: str, reason: str) -> str:
        self.refusals[kind] = self.refusals.get(kind, 0) + 1
        reason = f"rejected: {reason}"
        self.telemetry.emit("update_screened_out", worker=worker.id, kind=kind, reason=reason)
        if kind == "quarantined":
            return reason
        self.quarantine.refused(worker, self.state.version)
        if self.quarantine.holds(worker.id):
            # The agent logs the server's reason: say why it is held, not only what this update did.
            reason = f"{reason}; {self.quarantine.reason(worker.id)}"
        return reason

    def public(self) -> dict[str, Any]:
        history = [n for n in self.accepted if n > 0.0]
        return {
            "enabled": self.settings.enabled,
            "refusals": dict(self.refusals),
            "quarantined": self.quarantine.quarantined(),
            "median_norm": statistics.median(history) if history else None,
            "history": len(history),
            "direction_workers": self.direction.workers(),
            "clipped": self.clipped,
            "work_scaled": self.work_scaled,
            "drift_allowed": self.drift_allowed,
            "downweighted": self.downweighted,
            "claims_clamped": {} if self.claims_clamped is None else self.claims_clamped(),
            "claims_windows": {} if self.claims_windows is None else self.claims_windows(),
            "cosines_measured": self.cosines_measured,
            "min_accepted_cosine": None if self.min_accepted_cosine is None else round(self.min_accepted_cosine, 4),
        }
