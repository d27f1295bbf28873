"""Precision ``auto``: time a few training steps of the run's model in each precision, train in the fastest.

Assuming a precision per device type was wrong by up to 2.9x: bf16 autocast
on CPU ran the built-in models 1.6-2.9x slower than fp32 on a 2-core EPYC
(mnist1d; 11-19% slower for the digits CNN), while on other CPUs it ran
1.0-1.7x faster on the larger models. So the agent measures, once, when the
run's model is known: ``measure`` trains a deep copy of the model (its own
optimizer, synthetic inputs of the model's shape, the run's batch size) for
a warm-up step and a few timed steps per candidate, and ``choose`` picks.
The steps run on a batch of the task's own example data with its loss and optimizer.

``choose`` keeps fp32 unless another precision is clearly faster (its
median step at least ``margin`` = 5% quicker): lower precision costs
accuracy headroom, so a gain within timing noise is not worth it. A
candidate whose loss is not finite is numerically unsafe and never chosen.
Candidates: fp32 everywhere; bf16 on CPU and on CUDA devices that support
it; fp16 with loss scaling (GradScaler) on CUDA only (fp16 autocast on CPU
falls back to reference kernels, 5-36x slower).

The agent keeps each measurement in a small cache file (``cache_path``:
``~/.cache/hermes/precision.json``, ``HERMES_PRECISION_CACHE=off`` or a
path) keyed by model layout, batch, device, threads and torch build, so a
restart or the next run on the same device starts training without the
probe (the largest part of start-up after importing torch).
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import math
import platform
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from hermes.client.trainer import LocalTrainer
from hermes.common.atomic_write import write_atomic
from hermes.common.cache_paths import user_cache
from hermes.common.task import LossFn, OptimizerFn

log = logging.getLogger(__name__)

__all__ = ["PrecisionChoice", "cache_path", "candidates", "choose", "measure", "pick_precision"]

# n -> a batch of n (input, target) pairs shaped like the task's data (hermes.common.task_registry.example_batch).
Example = Callable[[int], tuple[torch.Tensor, torch.Tensor]]

# A precision must beat fp32 by this fraction of fp32's step time to be chosen.
MARGIN = 0.05
# A precision this many times slower than fp32 on the probe step is not timed at full batch.
PROBE_LOSES = 2.0


@dataclass(frozen=True)
class PrecisionChoice:
    precision: str
    # Median seconds per training step of each precision timed (inf: not finite, or failed).
    timings: dict[str, float] = field(default_factory=dict)
    # "measured", "forced", or why measuring was not possible.
    how: str = "measured"

    def describe(self) -> str:
        steps = ", ".join(f"{p} {t * 1e3:.2f} ms" if math.isfinite(t) else f"{p} unsafe"
                          for p, t in self.timings.items())
        return f"{self.precision} ({self.how}{': ' + steps if steps else ''})"

    def report(self) -> dict[str, float]:
        """Milliseconds per step by precision, as the agent's stats carry them (finite ones only)."""
        return {p: round(t * 1e3, 3) for p, t in self.timings.items() if math.isfinite(t)}


def candidates(device: torch.device) -> list[str]:
    """The precisions worth timing on ``device``, fp32 first."""
    if device.type == "cuda":
        out = ["fp32", "fp16"]
        if torch.cuda.is_bf16_supported():
            out.append("bf16")
        return out
    if device.type == "cpu":
        return ["fp32", "bf16"]
    return ["fp32"]


def choose(timings: Mapping[str, float], *, margin: float = MARGIN) -> str:
    """The precision to train in, from median step seconds by precision (a pure function).

    fp32 unless the fastest other precision with a finite time takes at most
    ``(1 - margin)`` of fp32's time. Without a finite fp32 time, the fastest finite one.
    """
    if not 0.0 <= margin < 1.0:
        raise ValueError(f"margin must be in [0, 1), got {margin}")
    finite = {p: t for p, t in timings.items() if math.isfinite(t) and t > 0}
    if not finite:
        return "fp32"
    fastest = min(finite, key=lambda p: finite[p])
    base = finite.get("fp32")
    if base is None:
        return fastest
    return fastest if finite[fastest] <= (1.0 - margin) * base else "fp32"


def measure(model: nn.Module, example: Example, batch_size: int,
            device: torch.device, precisions: Sequence[str], *, steps: int = 3,
            budget_seconds: float = 0.8, loss: LossFn = F.cross_entropy,
            optimizer: OptimizerFn | None = None) -> dict[str, float]:
    """Median seconds per training step of a copy of ``model`` in each precision.

    The model itself is never trained: each precision trains its own deep
    copy with its own optimizer. One warm-up step (kernel selection,
    allocator) is not timed; then up to ``steps`` timed steps, fewer once
    the precision has used its share of ``budget_seconds`` (so the whole
    takes about ``budget_seconds``, or one or two steps per precision where
    a step alone is longer). A step whose loss is not finite makes the
    precision's time inf (unsafe).
    """
    xt, yt = example(batch_size)
    x, y = xt.cpu().numpy(), yt.cpu().numpy()
    batch_size = max(1, min(batch_size, len(y)))
    share = budget_seconds / max(1, len(precisions))
    out: dict[str, float] = {}
    probes: dict[str, float] = {}
    for precision in precisions:
        trainer = LocalTrainer(copy.deepcopy(model), lr=0.01, device=device, precision=precision, loss=loss,
                               optimizer=optimizer)
        # A two-sample probe step first: a precision already twice as slow as the first
        # one there is not run at full batch (bf16 resnet18 on a 2-core EPYC: 64 s a
        # step against fp32's 2.3 s); its time is the first's scaled by the probes' ratio.
        if device.type == "cuda":
            # A precision's first CUDA step loads its kernels; timed, it made agents on an H100
            # report fp16 and bf16 at 0.28-0.55 s a step against fp32's 2 ms (2026-11-27).
            trainer.train_cycle(x[:2], y[:2], 2, steps=1)
        probe = trainer.train_cycle(x[:2], y[:2], 2, steps=1)
        probes[precision] = probe.compute_seconds if math.isfinite(probe.loss) else math.inf
        first = precisions[0]
        if precision != first and probes[precision] > PROBE_LOSES * probes[first]:
            out[precision] = out[first] * probes[precision] / max(probes[first], 1e-9)
            continue
        times: list[float] = []
        start = time.perf_counter()
        for i in range(steps + 1):
            result = trainer.train_cycle(x, y, batch_size, steps=1)
            if not math.isfinite(result.loss):
                times = [math.inf]
                break
            spent = time.perf_counter() - start
            # The warm-up step stands for the precision when it alone spent the share: an
            # upper bound, and a precision that slow loses anyway (bf16 alexnet on a
            # 2-core EPYC: one step 3.9 s against fp32's 0.29 s). Not on CUDA, where the
            # first full batch may still be choosing kernels (cuDNN, cuBLAS): time one more.
            if i > 0 or i == steps or (spent > share and device.type != "cuda"):
                times.append(result.compute_seconds)
            if spent > share and times:
                break
        out[precision] = statistics.median(times)
        del trainer
    return out


def cache_path() -> Path | None:
    """Where measured choices are kept between agent starts: ``HERMES_PRECISION_CACHE`` (a file,
    or ``off``), else ``$XDG_CACHE_HOME/hermes/precision.json`` (``~/.cache`` without it)."""
    return user_cache("HERMES_PRECISION_CACHE", "precision.json")


# Entries kept in the cache file: a device sees few (model, batch, threads) combinations.
_CACHE_ENTRIES = 64


def _cache_key(model: nn.Module, example: Example, batch_size: int, device: torch.device,
               precisions: Sequence[str]) -> str:
    """The measurement's identity: same model layout, inputs, batch, device, threads and torch."""
    layout = [(k, tuple(v.shape), str(v.dtype)) for k, v in model.state_dict().items()]
    x, y = example(1)
    inputs = [list(x.shape[1:]), str(x.dtype), list(y.shape[1:]), str(y.dtype)]
    what = json.dumps([type(model).__name__, layout, inputs, batch_size, str(device),
                       torch.get_num_threads(), torch.__version__, platform.machine(), platform.processor(),
                       list(precisions)], default=str)
    return hashlib.sha256(what.encode()).hexdigest()[:32]


def _read_cache(path: Path) -> dict[str, dict]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def pick_precision(requested: str, model: nn.Module, example: Example, batch_size: int, device: torch.device,
                   *, loss: LossFn = F.cross_entropy, optimizer: OptimizerFn | None = None,
                   cache: Path | None = None) -> PrecisionChoice:
    """``requested`` when forced; for ``auto``, the measured choice (fp32 if the model cannot be timed).

    With ``cache`` (a JSON file) a measurement of the same model layout, batch, device, threads and
    torch build is reused instead of timed again (``how`` says so): the probe was the largest part of
    an agent's start-up (0.8 s of timed steps plus one warm-up step per precision).
    """
    if requested != "auto":
        return PrecisionChoice(requested, how="forced")
    precisions = candidates(device)
    key = _cache_key(model, example, batch_size, device, precisions) if cache is not None else ""
    if cache is not None:
        hit = _read_cache(cache).get(key)
        if isinstance(hit, dict) and hit.get("precision") in precisions and isinstance(hit.get("timings"), dict):
            timings = {str(p): float(t) for p, t in hit["timings"].items()}
            choice = PrecisionChoice(choose(timings), timings, how=f"measured {hit.get('at', 'earlier')}, cached")
            log.info("precision auto chose %s", choice.describe())
            return choice
    try:
        timings = measure(model, example, batch_size, device, precisions, loss=loss, optimizer=optimizer)
    except (RuntimeError, ValueError, TypeError) as exc:
        # A task whose inputs are not float tensors of input_shape (token ids, say) cannot be
        # timed on synthetic data: train in fp32, the safe precision.
        log.warning("precision auto: could not time the model (%s); training in fp32", exc)
        return PrecisionChoice("fp32", how="not timed")
    choice = PrecisionChoice(choose(timings), timings)
    log.info("precision auto chose %s", choice.describe())
    if cache is not None and all(math.isfinite(t) for t in timings.values()):
        _write_cache(cache, key, choice)
    return choice


def _write_cache(path: Path, key: str, choice: PrecisionChoice) -> None:
    entries = _read_cache(path)
    entries.pop(key, None)
    entries[key] = {"precision": choice.precision, "timings": choice.timings,
                    "at": time.strftime("%Y-%m-%d", time.gmtime())}
    while len(entries) > _CACHE_ENTRIES:
        entries.pop(next(iter(entries)))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Atomic: agents starting together (threads of one process too) never read half a file.
        write_atomic(path, json.dumps(entries))
    except OSError as exc:
        log.info("precision cache %s not written (%s); the next start measures again", path, exc)
