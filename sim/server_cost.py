"""How long the server's own work takes on the virtual clock: a model fitted to the real engine, or measured.

The simulator runs the real ``Engine`` in-process; the CPU time that takes
on the simulating machine says nothing about the virtual clock, which must
not depend on the machine's load. So each engine operation advances the
server's clock by ``ServerCost.seconds(op, params=..., workers=...)``:

* :func:`calibrated` (the default, deterministic): ``a + b * params + c * workers``
  per operation, fitted to the CPU seconds the real engine took on this
  machine (``benchmarks/sim_calibrate_cost.py engine``; :data:`CALIBRATION`
  records the figures, their date and the machine);
* :func:`measured` (not deterministic): the CPU seconds of this thread the
  engine's own handling of each message took (``sim.engine_driver.CpuTimed``:
  the coroutine's steps, not the virtual time it waits at a barrier), so a
  run on a loaded or slower machine gives another virtual time. An
  evaluation's window is the previous evaluation's measured CPU time (the
  first: the calibrated model's). For checking the model, never for
  comparing runs.

Operations: ``register`` (a registration), ``pull`` (a model request,
encoding included), ``push`` (decode, checks and screening of an update,
without the fold), ``fold`` (one model step, ``ModelState.apply``),
``assign`` (a request for work), ``evaluate`` (one evaluation on the run's
``eval_max_samples`` test samples), ``heartbeat``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

OPS = ("register", "pull", "push", "fold", "assign", "evaluate", "heartbeat")


@runtime_checkable
class ServerCost(Protocol):
    def seconds(self, op: str, *, params: int, workers: int) -> float: ...


@dataclass(frozen=True)
class Coefficients:
    a: float  # seconds per operation
    b_per_param: float  # seconds per model parameter
    c_per_worker: float  # seconds per registered worker


# Fitted by `python benchmarks/sim_calibrate_cost.py engine --out docs/bench/sim-calibration/server-cost.json`
# on 2026-11-27 (see DATE, MACHINE): MLPs of 10K-4M parameters, 4-1,024 workers, torch 1 thread, CPU seconds
# of this process. push = the push's total under asp minus the fold measured alone (both in the file).
DATE = "2026-11-27 14:40:13 UTC (medians of 5; load average 20.67 before, 22.74 after: CPU seconds, not wall)"
MACHINE = "2 vCPU AMD EPYC, 24 GB, Linux, torch 1 intra-op thread"
# Evaluation samples the evaluate figures were measured with (RunConfig.eval_max_samples' default).
EVAL_SAMPLES = 2000
CALIBRATION: dict[str, Coefficients] = {
    "register": Coefficients(0.000109393, 0, 2.49452e-07),
    "pull": Coefficients(0.000255297, 4.42173e-10, 0),
    "push": Coefficients(0.000570331, 1.27425e-09, 0),
    "fold": Coefficients(4.41617e-05, 4.54535e-10, 0),
    "assign": Coefficients(0.000438088, 0, 0),
    "evaluate": Coefficients(0.00176756, 7.01507e-08, 0),
    "heartbeat": Coefficients(2.3252e-05, 0, 0),
}


# The server's forward-pass rate when the loss aggregation scores a model (LossProbe.loss_of, Hermes Eq. 5-6):
# the paper's CNN (hidden 320) on 512 mnist1d samples, 163.8 MFLOP in a median 5.59 ms of CPU over 20, one torch
# thread, 2026-11-27 17:16 UTC, load average 12-14 (python benchmarks/sim_probe_cost.py). The calibrated
# ``push`` was measured under asp, whose aggregation scores nothing.
PROBE_FLOPS = 29.3e9
# Models a push's scoring runs forward: the candidate's and the global model's (cached per version, and every
# applied push makes a new version).
PROBE_PASSES = 2


def probe_seconds(cost: object, *, scores: bool, samples: int, forward_flops: float) -> float:
    """Server CPU seconds a push costs in the loss aggregation's scoring; 0 without one or with ``ZeroCost``."""
    if not scores or isinstance(cost, ZeroCost):
        return 0.0
    speed = getattr(cost, "speed", 1.0)
    return PROBE_PASSES * samples * forward_flops / PROBE_FLOPS / speed


class UnknownOperation(ValueError):
    """An operation the cost model does not know."""


def _check(op: str, params: int, workers: int) -> None:
    if op not in OPS:
        raise UnknownOperation(f"unknown server operation {op!r}; known: {', '.join(OPS)}")
    if params < 0 or workers < 0:
        raise ValueError(f"params and workers must be >= 0, got {params} and {workers}")


class CalibratedCost:
    """seconds = a + b * params + c * workers per operation (deterministic).

    ``eval_samples`` scales the evaluate figure linearly from the
    :data:`EVAL_SAMPLES` it was measured with (a forward pass per sample);
    ``speed`` divides every figure (a server ``speed`` times this machine's).
    """

    def __init__(self, coefficients: Mapping[str, Coefficients] = CALIBRATION, *, eval_samples: int = EVAL_SAMPLES,
                 speed: float = 1.0) -> None:
        missing = [op for op in OPS if op not in coefficients]
        if missing:
            raise ValueError(f"cost model lacks operation(s) {missing}")
        if not speed > 0 or eval_samples <= 0:
            raise ValueError("speed and eval_samples must be positive")
        self.coefficients = dict(coefficients)
        self.eval_scale = eval_samples / EVAL_SAMPLES
        self.speed = speed

    def seconds(self, op: str, *, params: int, workers: int) -> float:
        _check(op, params, workers)
        k = self.coefficients[op]
        s = k.a + k.b_per_param * params + k.c_per_worker * workers
        if op == "evaluate":
            s *= self.eval_scale
        return s / self.speed


class MeasuredCost:
    """The CPU seconds of the engine call itself: wrap it in ``timed(op)``, then ask ``seconds(op, ...)``.

    Not deterministic: the figure is this machine's, under its load. An
    operation asked for without a measurement falls back to the calibrated
    model (and counts it in ``fallbacks``).
    """

    def __init__(self, fallback: ServerCost | None = None) -> None:
        self.fallback = fallback if fallback is not None else CalibratedCost()
        self._last: dict[str, float] = {}
        self.fallbacks = 0
        self.measured = 0

    @contextlib.contextmanager
    def timed(self, op: str) -> Iterator[None]:
        _check(op, 0, 0)
        t0 = time.process_time()
        try:
            yield
        finally:
            self._last[op] = time.process_time() - t0

    def record(self, op: str, seconds: float) -> None:
        _check(op, 0, 0)
        self._last[op] = seconds

    def seconds(self, op: str, *, params: int, workers: int) -> float:
        _check(op, params, workers)
        got = self._last.pop(op, None)
        if got is None:
            self.fallbacks += 1
            return self.fallback.seconds(op, params=params, workers=workers)
        self.measured += 1
        return got


def calibrated() -> ServerCost:
    return CalibratedCost()


def measured() -> ServerCost:
    return MeasuredCost()


class ZeroCost:
    """No server cost: the engine answers at once (a server that is never the bottleneck)."""

    def seconds(self, op: str, *, params: int, workers: int) -> float:
        return 0.0


def by_name(name: str) -> ServerCost:
    """The cost model ``hermes-sim --server-cost`` and ``hermes.simulate(server_cost=)`` name."""
    models = {"calibrated": calibrated, "measured": measured, "none": ZeroCost}
    if name not in models:
        raise ValueError(f"server cost {name!r}; known: {', '.join(models)}")
    return models[name]()
