"""Scores candidate models for loss-weighted aggregation (Hermes Alg. 2), with the task's loss.

Scoring is the server's hottest cost under the ``loss`` rule: one forward
pass over a fixed validation subset per push. It runs batched, in inference
mode, in executor threads (never on the event loop), and the global model's
loss is cached per version so each push costs one scoring, not two.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from hermes.common.task import Task
from hermes.common.task_registry import batch_of
from hermes.common.tensors import ModelSpec, build_checked, flatten, float_state, load_flat
from hermes.common.wire import Payload
from hermes.server.metrics import ServerMetrics
from hermes.server.state import ModelState

# BatchNorm's running statistics in a flat model vector (``ModelSpec.entries`` names).
_BN_STATS = ("running_mean", "running_var")


def bn_stat_ranges(spec: ModelSpec) -> list[tuple[int, int]]:
    """[lo, hi) of every BatchNorm running mean and variance in the flat vector."""
    ranges, off = [], 0
    for name, shape in spec.entries:
        n = math.prod(shape)
        if name.rsplit(".", 1)[-1] in _BN_STATS:
            ranges.append((off, off + n))
        off += n
    return ranges


class LossProbe:
    def __init__(
        self, task: Task, spec: ModelSpec, state: ModelState, validation: Any, *, samples: int, seed: int,
        metrics: ServerMetrics, batch_size: int = 1024, recalibrate: bool = False, rotate: bool = False,
    ) -> None:
        self.task = task
        self.state = state
        self.metrics = metrics
        self.batch_size = batch_size
        self.model = build_checked(task.model, spec).eval()
        # loss.bn_stats recalibrate: models are scored with BatchNorm's statistics of the probe's samples, and
        # every fold's BatchNorm statistics are measured on them (recalibrated), not added up from the deltas.
        self._bn = [m for m in self.model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)
                    and m.track_running_stats] if recalibrate else []
        self.stat_ranges = bn_stat_ranges(spec) if self._bn else []
        idx = np.sort(np.random.default_rng([seed, 0x1055]).permutation(len(validation))[:samples])
        self.x, self.y = batch_of(validation, idx.tolist())
        # loss.probe_rotation: each version scored on its own draw (the newest two kept: a candidate scored
        # against version v may be folded after v + 1 appeared).
        self._rotation: tuple[Any, int, int] | None = (validation, samples, seed) if rotate else None
        self._drawn: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._lock = threading.Lock()  # one replica, one scoring at a time
        self._global: tuple[int, float] | None = None
        self._descent: tuple[int, torch.Tensor] | None = None

    @property
    def recalibrates(self) -> bool:
        return bool(self.stat_ranges)

    def samples_for(self, version: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The probe's samples for models scored while ``version`` is current: the fixed subset, or with
        rotation a draw of its own for each version (seeded by the run's seed and the version)."""
        if self._rotation is None:
            return self.x, self.y
        drawn = self._drawn.get(version)
        if drawn is None:
            validation, samples, seed = self._rotation
            rng = np.random.default_rng([seed, 0x1055, version])
            idx = np.sort(rng.choice(len(validation), size=min(samples, len(validation)), replace=False))
            # Drawn outside inference mode (_score's): descent() takes gradients through the same samples.
            with torch.inference_mode(False):
                drawn = batch_of(validation, idx.tolist())
            self._drawn = {v: d for v, d in self._drawn.items() if v >= version - 1}
            self._drawn[version] = drawn
        return drawn

    @torch.inference_mode()
    def _score(self, flat: torch.Tensor, stats_out: torch.Tensor | None = None, version: int | None = None) -> float:
        """The probe loss of ``flat``; with recalibration, scored with its BatchNorm statistics measured on the
        probe's samples, which go into ``stats_out`` (the flat layout) when given. ``version``: whose samples
        (rotation; default the current version's)."""
        with self._lock:
            t0 = time.perf_counter()
            x, y = self.samples_for(self.state.version if version is None else version)
            load_flat(self.model, flat)
            for m in self._bn:
                # momentum None: a cumulative average over the batches, the statistics of the samples themselves.
                m.reset_running_stats()
                m.momentum = None
                m.train()
            total = 0.0
            try:
                for i in range(0, len(y), self.batch_size):
                    xb, yb = x[i : i + self.batch_size], y[i : i + self.batch_size]
                    if self.task.transform is not None:  # as the evaluator scores (train False)
                        xb, yb = self.task.transform(xb, yb, False)
                    total += float(self.task.loss(self.model(xb), yb)) * len(yb)
            finally:
                for m in self._bn:
                    m.eval()
            if stats_out is not None and self._bn:
                measured = flatten(self.model)
                for lo, hi in self.stat_ranges:
                    stats_out[lo:hi] = measured[lo:hi]
            self.metrics.loss_eval_seconds.observe(time.perf_counter() - t0)
            return total / max(1, len(y))

    def recalibration(self, terms: Sequence[tuple[Payload, float]]) -> tuple[Payload, float] | None:
        """The fold's BatchNorm statistics measured instead of added (loss.bn_stats recalibrate; the SWA
        procedure, Izmailov et al. 2018, Sec. 3.2: the statistics of the averaged weights recomputed on
        data): with w' = w + sum_k a_k delta_k, one more delta whose statistics entries are the probe samples'
        statistics of w' minus w's, applied at weight 1 in the same fold (and journaled with it, so a resume
        replays it). Its probe loss comes back too: it is the new global model's. None: nothing to measure.
        Caller holds the step lock (no other fold moves w meanwhile)."""
        if not self.stat_ranges:
            return None
        _, flat = self.state.snapshot()
        after = flat.clone()
        for payload, weight in terms:
            for off, piece in payload.fp32_pieces():
                after[off : off + piece.numel()].add_(piece, alpha=weight)
        # The measured statistics land in the delta's own ranges (zero elsewhere), then w' taken off them: no second model-sized copy.
        delta = torch.zeros_like(after)
        loss = self._score(after, stats_out=delta)
        for lo, hi in self.stat_ranges:
            delta[lo:hi].sub_(after[lo:hi])
        return Payload(dtype=torch.float32, chunks=(delta,), shapes=((delta.numel(),),)), loss

    def set_global(self, version: int, loss: float) -> None:
        """The probe loss of ``version`` measured by its fold (recalibration), cached as global_loss's; with
        rotation it was measured on the previous version's samples, so the next global_loss scores it afresh."""
        if self._rotation is None:
            self._global = (version, loss)

    def loss_of(self, flat: torch.Tensor) -> float:
        """The probe loss of any model (screening's effect test)."""
        return self._score(flat)

    def candidate_loss(self, payload: Payload, *, from_current: bool = False) -> float:
        return self._score(self.state.candidate(payload, from_current=from_current))

    def global_loss(self) -> tuple[int, float]:
        """(version, loss) of the current global model, cached per version."""
        cached = self._global
        if cached is not None and cached[0] == self.state.version:
            return cached
        version, flat = self.state.snapshot()
        self._global = (version, self._score(flat, version=version))
        return self._global

    def descent(self) -> torch.Tensor:
        """-grad of the probe loss at the current global model (flat, fp32), cached per version.

        The direction screening's reference (issue 29): Zeno++ (Xie, Koyejo, Gupta 2020,
        Alg. 1 / Eq. 3) accepts an update only when it descends a loss the server computes
        itself on data the workers do not control; here on the loss probe's validation subset.
        """
        cached = self._descent
        if cached is not None and cached[0] == self.state.version:
            return cached[1]
        version, flat = self.state.snapshot()
        with self._lock:
            x, y = self.samples_for(version)
            load_flat(self.model, flat)
            self.model.zero_grad(set_to_none=True)
            n = max(1, len(y))
            with torch.enable_grad():
                for i in range(0, len(y), self.batch_size):
                    yb = y[i : i + self.batch_size]
                    loss = self.task.loss(self.model(x[i : i + self.batch_size]), yb) * (len(yb) / n)
                    loss.backward()
            # In the flat vector's layout (float_state: parameters and float buffers); a buffer has no gradient.
            grads = [v.grad if v.grad is not None else torch.zeros_like(v) for _, v in float_state(self.model)]
            direction = -torch.cat([g.reshape(-1) for g in grads]).to(torch.float32)
            self.model.zero_grad(set_to_none=True)
        self._descent = (version, direction)
        return direction
