"""HermesGUP: push an update only when the validation loss improved significantly.

Hermes Sec. IV-B, Alg. 1 and Eq. 4. The paper's text and the authors' code
disagree on details, so this module states OUR rule, exactly:

1. Window. The gate keeps the last ``w`` finite losses it observed (a queue,
   Hermes Fig. 8). The current loss ``x`` is scored against the window of the
   PREVIOUS losses only, never against a window that already contains ``x``:

       z = (x - mu) / sigma                                  (Hermes Eq. 4)

   with ``mu`` the mean and ``sigma`` the population standard deviation
   (ddof=0) of the previous ``<= w`` losses.

   Why exclude ``x``: if ``x`` is one of the ``n`` values its own mean and
   std come from, then ``|z| <= sqrt(n - 1)`` (proof at ``inclusive_z_bound``).
   With ``n <= 2`` that is ``|z| <= 1`` and a threshold of ``alpha = -1.3``
   can never fire. The authors' code scores ``x`` inside its own window, which
   is why their gate stays silent until the queue holds three losses.
   ``current_in_window=true`` is that reading (Sec. IV-B-1: new losses are
   appended to the queue, and x is scored "from this queue"): z over the
   last ``w`` losses with ``x`` among them.

2. Warm-up. At least two previous losses are needed for a spread; with fewer
   the decision is ``push=False``, ``reason="warmup"``, ``z=None``.

3. Degenerate spread. ``sigma_eff = max(sigma, 1e-12, 1e-6 * |mu|)``, so a
   flat window never yields NaN or inf: ``x == mu`` gives ``z = 0.0`` and
   ``x`` slightly below gives a large negative but finite ``z``.

4. Non-finite loss (NaN, +-inf): ``push=False``, ``reason="non_finite"``;
   the loss is NOT added to the window (it would poison mu and sigma for
   ``w`` cycles) and the cycle counts as silent.

5. Threshold relaxation (Hermes Alg. 1 lines 11-12, "decay alpha by beta"
   once ``N_iter >= lambda``). With ``silent`` the number of cycles since the
   last push, counted before this decision, OUR default (``relaxation="step"``)

       alpha_eff = alpha + beta * floor(silent / lambda)

   so with Table I defaults silent 0-4 -> -1.3, 5-9 -> -1.2, 10-14 -> -1.1,
   and so on without bound: any finite ``z`` eventually fires (liveness).
   The paper's literal rule (``relaxation="paper"``) decays alpha by beta
   after EVERY iteration that ends with N_iter >= lambda, so before a decision
   ``max(0, silent - lambda + 1)`` decays have happened:
   silent 4 -> -1.3, 5 -> -1.2, 6 -> -1.1, 7 -> -1.0. ``relaxation="multiplicative"``
   shrinks alpha towards 0 by the factor (1 - beta) per such iteration
   (alpha_eff = alpha * (1 - beta) ** max(0, silent - lambda + 1)), our reading
   of "decay" as the authors' multiplicative decay; it never crosses 0, so a
   loss that got worse never fires. By default every mode resets with
   ``silent`` on a push (a threshold relaxed for ever would let every later
   update through); ``alpha_reset=false`` is Alg. 1 as printed, whose line 8
   resets only N_iter: the decays taken so far are kept and later silent
   cycles add to them.

6. Decision: push iff ``z <= alpha_eff`` (``reason="zscore"``), otherwise
   ``reason="above_threshold"``. A push resets ``silent`` to 0, which brings
   ``alpha_eff`` back to ``alpha`` (unless ``alpha_reset`` is off, rule 5).

7. The window is kept across pushes (not cleared). Every finite loss is
   appended after its decision, pushed or not; the oldest is dropped beyond
   ``w``. Warm-up losses are appended too: that is how the gate warms up.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from hermes.common.policies.base import Core, Policy, register

log = logging.getLogger(__name__)

# Floors for the spread (rule 3): an absolute one for losses near zero and a
# relative one so that float noise around a large mean is not read as signal.
_SIGMA_ABS_FLOOR = 1e-12
_SIGMA_REL_FLOOR = 1e-6

REASONS = ("warmup", "zscore", "above_threshold", "non_finite", "diverged")


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class GateParams(BaseModel):
    """HermesGUP's hyper-parameters, the run config's ``zscore`` section; defaults are Hermes Table I
    (w = 10, alpha = -1.3, beta = 0.1, lambda = 5). Validated here and nowhere else."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    # strict: a window or lambda of 2.0 is a mistake to report, not an int to coerce. A spread
    # needs two previous losses (rule 2), so a smaller window would never leave warm-up.
    window: int = Field(default=10, ge=2, strict=True,
                        description="W, validation losses in the gate's window (Hermes Table I).")
    alpha: float = Field(default=-1.3, allow_inf_nan=False,
                         description="Push when the loss's z-score is <= alpha (Hermes Eq. 4, Table I).")
    # A negative beta would tighten the threshold while silent and could starve the worker.
    beta: float = Field(default=0.1, ge=0.0, allow_inf_nan=False,
                        description="Relaxation step of alpha (Hermes Alg. 1 line 12).")
    lam: int = Field(default=5, ge=1, strict=True,
                     description="Lambda, silent cycles before alpha relaxes (Hermes Alg. 1 line 11).")
    relaxation: Literal["step", "paper", "multiplicative"] = Field(
        default="step", description="How alpha relaxes while silent: 'step' (ours, +beta every lambda cycles), "
                                    "'paper' (+beta every cycle once N_iter >= lambda), 'multiplicative' (*(1-beta)).")
    # Two readings Alg. 1 leaves open, each with the paper's rule one setting away (docs/papers.md, deviations).
    alpha_reset: bool = Field(
        default=True, description="A push brings alpha back to zscore.alpha (ours). false: Hermes Alg. 1, whose line 8 "
                                  "resets only N_iter, so the relaxation so far is kept after a push.")
    current_in_window: bool = Field(
        default=False, description="Score the current loss against the window that already holds it (Hermes "
                                   "Sec. IV-B-1, Alg. 1 line 1: the queue of the last w losses, the newest "
                                   "included). false (ours): against the previous losses only (rule 1).")
    validation_samples: int = Field(default=256, gt=0, description="Validation samples the agent scores each cycle on.")
    # A deviation (docs/papers.md): in Alg. 1 a worker whose loss keeps failing the test trains on alone,
    # however far its model drifts. Measured (digits HL8, 2026-11-26): with local momentum a fast
    # worker's model went from loss 0.03 to chance (2.30) in 3 s of skipped cycles, and its next push
    # was refused by screening (norm 77 > 32 x median); 4 of 139 honest pushes were.
    resync_factor: float | None = Field(
        default=None, gt=1.0, allow_inf_nan=False, description="When a validation loss exceeds this many times "
        "the lowest loss in the gate's window (or is not finite), the local model has diverged: the agent takes "
        "the global model again instead of training on from it. Unset: Hermes Alg. 1, which never resyncs.")


@dataclass(frozen=True)
class GateDecision:
    push: bool
    z: float | None  # None when not computable (warm-up, non-finite loss)
    alpha: float  # the threshold in force for this decision
    silent_cycles: int  # cycles since the last push, before this decision
    reason: str  # one of REASONS
    # resync_factor: the local model diverged; the agent should take the global model again.
    resync: bool = False


def _decays(config: GateParams, silent_cycles: int) -> int:
    """Relaxation steps taken in ``silent_cycles`` silent cycles (rule 5)."""
    if config.relaxation == "step":
        return silent_cycles // config.lam
    return max(0, silent_cycles - config.lam + 1)


def relaxed_alpha(config: GateParams, silent_cycles: int, carried: int = 0) -> float:
    """The threshold in force after ``silent_cycles`` silent cycles (Hermes Alg. 1 lines 11-12; rule 5).

    step: alpha + beta * floor(silent / lambda); paper: alpha + beta * d;
    multiplicative: alpha * (1 - beta) ** d; with d = max(0, silent - lambda + 1)
    the decays Alg. 1 applied after the iterations that ended with N_iter >= lambda.
    ``carried``: decays kept from before the last push (``alpha_reset=false``, Alg. 1 line 8).
    """
    if not _is_int(silent_cycles) or silent_cycles < 0:
        raise ValueError(f"silent_cycles must be an integer >= 0, got {silent_cycles!r}")
    if not _is_int(carried) or carried < 0:
        raise ValueError(f"carried must be an integer >= 0, got {carried!r}")
    decays = carried + _decays(config, silent_cycles)
    if config.relaxation in ("step", "paper"):
        return config.alpha + config.beta * decays
    return config.alpha * (1.0 - config.beta) ** decays


def window_zscore(x: float, previous: tuple[float, ...] | list[float]) -> float:
    """z of x against the previous losses only (Hermes Eq. 4, rule 1 and 3 above)."""
    n = len(previous)
    if n < 2:
        raise ValueError(f"previous must hold at least 2 losses, got {n}")
    mu = math.fsum(previous) / n
    sigma = math.sqrt(math.fsum((v - mu) ** 2 for v in previous) / n)  # ddof=0
    sigma_eff = max(sigma, _SIGMA_ABS_FLOOR, _SIGMA_REL_FLOOR * abs(mu))
    return (x - mu) / sigma_eff


def inclusive_z_bound(n: int) -> float:
    """Largest |z| a value can reach when it is one of the n values scored (the authors' bug).

    Let d_i = x_i - mu over the n values, so sum(d_i) = 0 and n*sigma^2 = sum(d_i^2).
    For the scored value x: d_x = -sum_{i != x} d_i, and Cauchy-Schwarz gives
    d_x^2 <= (n - 1) * sum_{i != x} d_i^2 = (n - 1) * (n*sigma^2 - d_x^2),
    hence d_x^2 * n <= (n - 1) * n * sigma^2, i.e. |z| <= sqrt(n - 1).
    For n = 2 that is 1 < 1.3: an inclusive window of two can never fire at alpha = -1.3.
    """
    if not _is_int(n) or n < 1:
        raise ValueError(f"n must be an integer >= 1, got {n!r}")
    return math.sqrt(n - 1)


class ZScoreGate:
    """Per-worker HermesGUP state: the loss window and the silent-cycle count (Hermes Alg. 1)."""

    def __init__(self, config: GateParams = GateParams()) -> None:
        self._config = config
        self._window: deque[float] = deque(maxlen=config.window)
        self._silent = 0
        # Decays kept across pushes when alpha_reset is off (Alg. 1 line 8 resets only N_iter).
        self._carried = 0

    @property
    def config(self) -> GateParams:
        return self._config

    @property
    def window_losses(self) -> tuple[float, ...]:
        return tuple(self._window)

    @property
    def silent_cycles(self) -> int:
        return self._silent

    @property
    def alpha(self) -> float:
        """The threshold the next decision will use."""
        return relaxed_alpha(self._config, self._silent, self._carried)

    @property
    def carried_decays(self) -> int:
        return self._carried

    def observe(self, loss: float) -> GateDecision:
        """Score one validation loss and decide whether to push (Hermes Alg. 1 lines 4-12)."""
        silent = self._silent
        alpha_eff = relaxed_alpha(self._config, silent, self._carried)
        x = float(loss)
        factor = self._config.resync_factor
        resyncs = factor is not None
        if not math.isfinite(x):
            self._silent = silent + 1
            return GateDecision(push=False, z=None, alpha=alpha_eff, silent_cycles=silent, reason="non_finite",
                                resync=resyncs)
        # Against the window's best loss, not its median: a model that drifts a little every cycle
        # drags the median along (measured: 0.11 -> 2.0 over 20 cycles never exceeded 4x the median).
        if factor is not None and len(self._window) >= 2 and x > factor * min(self._window):
            # Left out of the window: the losses it keeps are those of a model that had not diverged.
            self._silent = silent + 1
            return GateDecision(push=False, z=None, alpha=alpha_eff, silent_cycles=silent, reason="diverged",
                                resync=True)
        if len(self._window) < 2:
            self._window.append(x)
            self._silent = silent + 1
            return GateDecision(push=False, z=None, alpha=alpha_eff, silent_cycles=silent, reason="warmup")
        # Hermes Eq. 4 over the previous losses (ours) or over the queue that already holds x (Sec. IV-B-1).
        scored = (*self._window, x)[-self._config.window:] if self._config.current_in_window else tuple(self._window)
        z = window_zscore(x, scored)
        push = z <= alpha_eff
        self._window.append(x)
        if push and not self._config.alpha_reset:
            self._carried += _decays(self._config, silent)
        self._silent = 0 if push else silent + 1
        return GateDecision(
            push=push,
            z=z,
            alpha=alpha_eff,
            silent_cycles=silent,
            reason="zscore" if push else "above_threshold",
        )

    def state(self) -> dict[str, Any]:
        """Plain data (lists, ints, floats) so a checkpoint can store it without pickle."""
        return {"window": list(self._window), "silent_cycles": self._silent, "carried_decays": self._carried}

    @classmethod
    def from_state(cls, config: GateParams, state: Mapping[str, Any]) -> ZScoreGate:
        """Restore a gate; if config.window shrank since the checkpoint, keep the newest losses."""
        if not isinstance(state, Mapping):
            raise ValueError(f"state must be a mapping, got {type(state).__name__}")
        window = state.get("window")
        silent = state.get("silent_cycles")
        if not isinstance(window, (list, tuple)):
            raise ValueError(f"window must be a list of finite losses, got {window!r}")
        values: list[float] = []
        for v in window:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"window must hold only finite losses, got {v!r}")
            values.append(float(v))
        if not isinstance(silent, int) or isinstance(silent, bool) or silent < 0:
            raise ValueError(f"silent_cycles must be an integer >= 0, got {silent!r}")
        gate = cls(config)
        gate._window.extend(values)  # deque(maxlen) keeps the newest
        carried = state.get("carried_decays", 0)  # absent from checkpoints written before alpha_reset existed
        if not isinstance(carried, int) or isinstance(carried, bool) or carried < 0:
            raise ValueError(f"carried_decays must be an integer >= 0, got {carried!r}")
        gate._silent = silent
        gate._carried = carried
        return gate


@register("gate", "always")
class AlwaysPush(Policy):
    """No gate: every cycle ends with a push (every system but Hermes)."""

    @classmethod
    def build(cls, core: Core, *args: Any, **params: Any) -> None:
        # The agent pushes after every cycle when the run has no gate object.
        return None


@register("gate", "zscore", "hermes-gup")
class ZScorePolicy(Policy):
    """HermesGUP (Hermes Alg. 1): the agent pushes only significant improvements, so a barrier could wait forever."""

    requires: ClassVar[dict[str, str]] = {
        "free_running": "lets workers skip pushes, so a {sync} barrier would wait forever; "
                        "use an asynchronous sync strategy ({providers})",
    }
    needs_validation_loss: ClassVar[bool] = True
    sections: ClassVar[tuple[str, ...]] = ("zscore",)

    @classmethod
    def build(cls, core: Core, *, zscore: GateParams, **params: Any) -> ZScoreGate:
        return ZScoreGate(zscore)
