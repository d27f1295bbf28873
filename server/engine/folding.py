"""Folding: one model step from a group of accepted updates, and the barrier releases that trigger it.

Split from :mod:`hermes.server.engine.core` (the engine's push path calls
these with its ``step_lock`` held); ``self`` is the engine.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from hermes.server.engine.offload import offload, payload_bytes
from hermes.server.engine.policies import Contribution

if TYPE_CHECKING:
    from hermes.server.engine.ports import FoldHost


async def fold(self: FoldHost, group: list[Contribution]) -> None:
    """One model step from a group of updates. Caller holds step_lock."""
    t0 = time.perf_counter()
    rule = self.policies.aggregation
    weights, extra = await rule.weigh(group, self)
    if rule.op != "combine" and any(u.scale != 1.0 for u in group):
        # Screening clipped these (a median / trimmed mean bounds them itself).
        weights = [w * u.scale for u, w in zip(group, weights)]
    nbytes = sum(payload_bytes(u.payload) for u in group)
    op, terms = rule.op, [(u.payload, w) for u, w in zip(group, weights)]
    if op == "combine":
        # Median / trimmed mean: the step is one delta, applied and journaled as such.
        op, terms = "apply", [(await offload(nbytes, rule.combined, group), 1.0)]
    elif op == "blend" and rule.window is not None:
        # fedasync.robust (issue 29): the model mixed in is the robust statistic of the window's models.
        terms = [(await offload(nbytes, rule.combined, group), weights[0])]
    recalibrated = None
    if op == "apply" and rule.probe is not None and rule.probe.recalibrates:
        # loss.bn_stats recalibrate: the step's BatchNorm statistics measured, not added (LossProbe.recalibration).
        recalibrated = await asyncio.to_thread(rule.probe.recalibration, terms)
        if recalibrated is not None:
            terms = [*terms, (recalibrated[0], 1.0)]
    if op == "blend":
        version = await asyncio.to_thread(self.state.blend, terms[0][0], terms[0][1])
    else:
        version = await offload(nbytes, self.state.apply, terms)
    if recalibrated is not None and rule.probe is not None:
        rule.probe.set_global(version, recalibrated[1])
    while self.state.rollbacks:
        bad, restored = self.state.rollbacks.pop(0)
        self.telemetry.emit("model_restored", bad_version=bad, restored=restored, version=version,
                            workers=[u.info.worker_id for u in group])
    if self.checkpoints is not None:
        # Journaled before any reply goes out: what is acknowledged survives a crash.
        await asyncio.to_thread(self.checkpoints.record_fold, version, op,
                                [p for p, _ in terms], [w for _, w in terms])
    self.metrics.apply_seconds.observe(time.perf_counter() - t0)
    for u in group:
        rec = self.registry.get(u.info.worker_id)
        if rec is not None:
            rec.applied += 1
    self.telemetry.emit(
        "update_applied", version=version, workers=[u.info.worker_id for u in group],
        staleness=[version - 1 - u.info.base_version for u in group], weights=[round(w, 6) for w in weights],
        **extra,
    )
    if self.config.max_updates is not None or self.config.max_epochs is not None:
        self.check_budgets()

async def process_releases(self: FoldHost) -> None:
    """Fold and wake whatever the strategy releases. Caller holds step_lock."""
    while (release := self.strategy.take_release()) is not None:
        group = [
            Contribution(h.info, h.payload, h.candidate_loss, h.scale)
            for w in release.aggregate
            if (h := self.held.get(w)) is not None and h.payload is not None
        ]
        group, self.buffered = group + self.buffered, []  # FedBuff's buffer: empty for other strategies
        try:
            if group:
                await fold(self, group)
        finally:
            # Even if folding failed, nobody may stay held for a step that is gone.
            for w in release.wake:
                held = self.held.pop(w, None)
                if held is not None and not held.reply.done():
                    held.reply.set_result(None)

