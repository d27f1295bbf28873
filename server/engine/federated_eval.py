"""Federated evaluation: every device scores the global model on its own held-out data, the server aggregates.

Every ``federated_eval.every`` server evaluations a round opens: each
worker's next assignment carries the round (``WorkReply.federated_round``);
the agent scores the global model it pulled last on
``task.local_eval_data(name)`` before training that cycle and sends the
score with the cycle's report (``CycleReport.federated``). When every worker
active at the round's opening or since has answered (or left), the round closes: each
metric and the loss is the devices' values weighted by their samples,

    federated_m = sum_k n_k m_k / sum_k n_k

(each m_k itself a sample-weighted mean over the device's batches, so this
is the metric over the union of the devices' held-out data, as the central
evaluation is over the test set). It is reported as ``federated_<metric>``
and ``federated_loss`` (event ``federated_evaluation``, status, summary),
and a target may name it (``--target federated_accuracy=0.9``).

Under asynchronous sync the devices may hold different versions when they
score (each the last it pulled); the round reports the range
(``versions``). Under a barrier (bsp) they score the same model.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from typing import Any

from hermes.common.config import RunConfig
from hermes.common.messages import WorkReply
from hermes.server.engine.goals import Goals
from hermes.server.engine.telemetry import Telemetry
from hermes.server.evaluator import Evaluation

log = logging.getLogger(__name__)


def aggregate(reports: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The samples-weighted mean of each device's loss and metrics, as federated_<name> (module docstring)."""
    total = sum(int(r["samples"]) for r in reports.values())
    if total <= 0:
        raise ValueError("no samples in the round's reports")
    names = set.intersection(*(set(r["metrics"]) for r in reports.values()))
    out = {"federated_loss": math.fsum(r["loss"] * r["samples"] for r in reports.values()) / total}
    for name in sorted(names):
        out[f"federated_{name}"] = math.fsum(r["metrics"][name] * r["samples"] for r in reports.values()) / total
    return out


class FederatedEval:
    def __init__(self, config: RunConfig, *, telemetry: Telemetry, goals: Goals,
                 active_ids: Callable[[], list[str]], stop: Callable[[str], None]) -> None:
        self.every = config.federated_eval.every
        self.telemetry = telemetry
        self.goals = goals
        self.active_ids = active_ids
        self.stop = stop
        self.evaluations = 0
        self.round = 0
        self.expected: set[str] = set()
        self.reports: dict[str, dict[str, Any]] = {}
        self.closed = True  # no round open
        self.latest: dict[str, Any] | None = None
        self.history: list[dict[str, Any]] = []

    @property
    def enabled(self) -> bool:
        return self.every > 0

    def on_evaluation(self, ev: Evaluation) -> None:
        """A central evaluation finished: every ``every``-th opens a round (an unfinished one closes with what it has)."""
        if not self.enabled:
            return
        self.evaluations += 1
        if self.evaluations % self.every:
            return
        if self.reports:
            self._close()
        self.round += 1
        self.expected = set(self.active_ids())
        self.reports = {}
        self.closed = False

    def stamp(self, worker_id: str, work: WorkReply) -> WorkReply:
        """``work`` with the open round, for a worker that has not answered it (one that joined since: it is waited for)."""
        if self.round == 0 or worker_id in self.reports or self.closed:
            return work
        self.expected.add(worker_id)
        return work.model_copy(update={"federated_round": self.round})

    def listener(self, fact: str, fields: Mapping[str, Any]) -> None:
        """Telemetry's subscriber: a cycle's report carrying an answer; a worker that left is not waited for."""
        if fact == "leave":
            self.expected.discard(str(fields.get("worker")))
        elif fact == "cycle" and fields.get("federated") is not None:
            report = fields["federated"]
            if report["round"] == self.round and not self.closed:
                self.reports[fields["worker"]] = dict(report)
        else:
            return
        # Workers that became active since the opening count too: a round is every active device's.
        self.expected |= set(self.active_ids())
        if self.reports and self.expected <= set(self.reports):
            self._close()

    def _close(self) -> None:
        reports, self.reports, self.expected, self.closed = self.reports, {}, set(), True
        metrics = aggregate(reports)
        versions = sorted({int(r["version"]) for r in reports.values()})
        result = {"round": self.round, "version": versions[-1], "versions": versions, "workers": sorted(reports),
                  "samples": sum(int(r["samples"]) for r in reports.values()), "loss": metrics["federated_loss"],
                  "metrics": metrics}
        self.latest = result
        self.history.append(result)
        self.telemetry.emit("federated_evaluation", **result)
        ev = Evaluation(version=versions[-1], loss=metrics["federated_loss"], accuracy=None, samples=result["samples"],
                        seconds=0.0, at=self.goals.run_clock.clock.time(), metrics=metrics)
        reason = self.goals.check_target(ev)
        if reason is not None:
            self.stop(reason)
