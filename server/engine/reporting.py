"""What the run tells people: status, summary, and the files written at its end."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING, Any

import torch

from hermes.common.config import RunConfig
from hermes.common.task import Direction, Task
from hermes.common.task_registry import effective_target
from hermes.server.evaluator import Evaluation, TargetReached
from hermes.server.model_files import BEST_MODEL_FILE, FINAL_MODEL_FILE, write_model

if TYPE_CHECKING:
    from hermes.server.engine.core import Engine

log = logging.getLogger(__name__)

__all__ = ["BEST_MODEL_FILE", "FINAL_MODEL_FILE", "Reporting"]


class Reporting:
    def __init__(self, engine: Engine) -> None:
        self.e = engine
        self._background: set[asyncio.Task] = set()

    def on_evaluation(self, ev: Evaluation) -> None:
        e = self.e
        e.telemetry.emit(
            "evaluation", version=ev.version, accuracy=ev.accuracy, loss=ev.loss, metrics=ev.metrics,
            seconds=round(ev.seconds, 6), elapsed=round(ev.at - e.started_at, 3),
        )
        target = effective_target(e.config)
        # Not once the run is stopping: the shutdown evaluation must not turn an
        # operator's stop into a reached target after the fact.
        if target is None or e.target_reached is not None or e.stopping:
            return
        metric, goal = target
        value = ev.score(metric)
        direction = "min" if metric == "loss" else e.task.direction(metric)
        if value is None or not (value >= goal if direction == "max" else value <= goal):
            return
        reached = TargetReached(ev.version, ev.accuracy, ev.at - e.started_at, ev.at, e.downtime_seconds,
                                metric=metric, value=value)
        e.target_reached = reached
        e.telemetry.emit("target_reached", target_accuracy=e.config.target_accuracy, target=f"{metric}={goal:g}",
                         **reached.public())
        what = f"target accuracy {goal}" if metric == "accuracy" else f"target {metric}={goal:g}"
        e.on_loop(e.request_stop, f"{what} reached at version {ev.version}")
        if e.checkpoints is not None:
            # The outcome and the best model are durable at once: a server killed before its
            # shutdown checkpoint resumes as a finished run, not as one that trains on.
            e.on_loop(self._checkpoint_soon, "target reached")

    def check_budgets(self) -> None:
        """Stop the run at the first budget reached (max_updates, max_epochs, max_seconds); the reason names it."""
        e = self.e
        if e.stopping:
            return
        c = e.config
        reason = None
        if c.max_updates is not None and e.state.version >= c.max_updates:
            reason = f"max_updates={c.max_updates} reached at version {e.state.version}"
        elif c.max_epochs is not None and e.epoch_progress >= c.max_epochs:
            reason = f"max_epochs={c.max_epochs:g} reached at version {e.state.version}"
        elif c.max_seconds is not None and e.clock.time() - e.started_at >= c.max_seconds:
            reason = f"max_seconds={c.max_seconds:g} reached at version {e.state.version}"
        if reason is not None:
            e.budget_reached = reason.partition("=")[0]
            e.telemetry.emit("budget_reached", budget=e.budget_reached, reason=reason, version=e.state.version)
            e.request_stop(reason)

    @staticmethod
    def primary_metric(config: RunConfig, task: Task) -> tuple[str, Direction]:
        """What "best" means for a run: the target's metric, else accuracy, else the task's first metric."""
        target = effective_target(config)
        names = list(task.metric_fns)
        metric = target[0] if target is not None else ("accuracy" if "accuracy" in names or not names else names[0])
        return metric, "min" if metric == "loss" else task.direction(metric)

    def _checkpoint_soon(self, reason: str) -> None:
        e = self.e
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (engine driven by hand in tests): the shutdown checkpoint will do
            return
        task = loop.create_task(e.checkpoints.save_or_report(reason))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def load_target(self, reached: dict[str, Any] | None) -> None:
        """A run that had reached its target before the restart is over: it stops again at once.

        Unless the resumed run asks for more (a higher target, or none at all:
        the operator resumed it to train on).
        """
        e = self.e
        target = effective_target(e.config)
        before = TargetReached(**reached) if reached is not None else None
        value = None if before is None else (before.accuracy if before.value is None else before.value)
        if target is not None and before is not None and before.metric == target[0] and value is not None:
            met = value >= target[1] if e.task.direction(target[0]) == "max" and target[0] != "loss" else value <= target[1]
        else:
            met = False
        if before is None or target is None or not met:
            if before is not None:
                log.info("the run had reached %s %s before the restart; the resumed run's target is %s, "
                         "so it trains on", before.metric, value, target)
            return
        e.target_reached = before
        what = f"target accuracy {target[1]}" if target[0] == "accuracy" else f"target {target[0]}={target[1]:g}"
        e.request_stop(f"{what} was reached at version {before.version} before the restart")

    def outcome(self) -> str:
        """running, stopped (operator, SIGTERM's shutdown), target_reached or budget_reached (the server stopped itself)."""
        if self.e.target_reached is not None:
            return "target_reached"
        if self.e.budget_reached is not None:
            return "budget_reached"
        return "stopped" if self.e.stopping else "running"

    def status(self) -> dict[str, Any]:
        e = self.e
        ev = e.evaluator.latest
        best = e.evaluator.best
        return {
            "preset": e.config.preset,
            "sync": e.config.sync,
            "model_version": e.state.version,
            "elapsed_seconds": e.elapsed(),
            # Server restarts: not counted in elapsed_seconds (training seconds).
            "downtime_seconds": round(e.downtime_seconds, 3),
            "epoch_progress": round(e.epoch_progress, 4),
            "task": e.task.name,
            # Where training samples live: "server" (shards) or "local" (task.local_data on each agent).
            "data_location": "local" if e.local_data else "server",
            # Shard record bytes sent to agents: by the data plane, plus what agents read from Kafka.
            "shard_bytes": sum(e.shard_bytes_served.values())
            + sum(w.shard_bytes.get("kafka", 0) for w in e.registry.all()),
            "evaluation": None if ev is None else {
                "version": ev.version, "accuracy": ev.accuracy, "loss": ev.loss, "metrics": ev.metrics, "at": ev.at,
            },
            "workers_active": len(e.registry.active_ids()),
            # Before min_workers have registered no work is handed out (engine/start_gate.py).
            "start_gate": e.start_gate.status(),
            "heterogeneity": e.registry.heterogeneity(),
            "workloads": {
                r.id: {"name": r.name, "dss": r.workload_history[-1][1], "mbs": r.workload_history[-1][2],
                       "accumulation": r.accumulation}
                for r in e.registry.all() if r.state == "active" and r.workload_history
            },
            "workers_total": len(e.registry.all()),
            "stopping": e.stopping,
            "stop_reason": e.stop_reason,
            "outcome": self.outcome(),
            "target_accuracy": e.config.target_accuracy,
            "target": None if (t := effective_target(e.config)) is None else f"{t[0]}={t[1]:g}",
            "budget_reached": e.budget_reached,
            "target_reached_at": None if e.target_reached is None else e.target_reached.public(),
            "best_metric": e.evaluator.primary,
            "best_accuracy": None if best is None else best.accuracy,
            "best_metrics": None if best is None else best.metrics,
            "best_version": None if best is None else best.version,
            "resumed_from": e.resumed_from,
            "last_checkpoint_version": None if e.checkpoints is None else e.checkpoints.last_version,
            "screening": e.screening.public(),
        }

    def summary(self) -> dict[str, Any]:
        e = self.e
        ev = e.evaluator.latest
        return {
            **self.status(),
            # Over every worker of the run: at shutdown the active ones have left.
            "heterogeneity": e.registry.heterogeneity(active_only=False),
            "config": e.config.model_dump(),
            "model": e.spec.to_dict() | {"entries": len(e.spec.entries)},
            "model_updates": e.state.version,
            "messages_total": sum(e.message_counts.values()),
            "messages_by_type": dict(e.message_counts),
            # Requests an agent did not send because another carried them (combine_messages).
            "carried_by_type": dict(e.carried_counts),
            "bytes_received_total": sum(w.server_bytes_in for w in e.registry.all()),
            "bytes_sent_total": sum(w.server_bytes_out for w in e.registry.all()),
            "final_accuracy": None if ev is None else ev.accuracy,
            "final_loss": None if ev is None else ev.loss,
            "final_metrics": None if ev is None else ev.metrics,
            "evaluations": [
                {"version": x.version, "accuracy": x.accuracy, "loss": x.loss, "metrics": x.metrics,
                 "elapsed": round(x.at - e.started_at, 3), "seconds": round(x.seconds, 6)}
                for x in e.evaluator.history
            ],
            "workers": [w.public() for w in e.registry.all()],
            "data_plane": e.kafka.info(),
            "shard_bytes_by_source": {"zmq": sum(e.shard_bytes_served.values()),
                                      "kafka": sum(w.shard_bytes.get("kafka", 0) for w in e.registry.all())},
        }

    def finish(self) -> dict[str, Any]:
        """The run's end: a last evaluation, the summary, the final and the best model written to OUT."""
        e = self.e
        # The current model, whatever it scores: the best one is reported beside it, not instead.
        final = e.evaluator.evaluate_now()
        summary = self.summary()
        e.telemetry.emit("run_end", version=e.state.version, accuracy=final.accuracy, loss=final.loss,
                         metrics=final.metrics, stop_reason=e.stop_reason,
                         best_version=summary["best_version"], best_accuracy=summary["best_accuracy"])
        if e.out_dir is not None:
            e.out_dir.mkdir(parents=True, exist_ok=True)
            summary["best_model_file"] = self.write_best_model()
            summary["final_model_file"] = self.write_final_model(final)
            tmp = e.out_dir / "server_summary.json.tmp"
            tmp.write_text(json.dumps(summary, indent=2))
            tmp.replace(e.out_dir / "server_summary.json")
        e.events.close()
        return summary

    def _model_metadata(self, ev: Evaluation | None, version: int) -> dict[str, str]:
        meta = {"version": str(version),
                # Which network: parameter names and shapes, the task and its fingerprint.
                "spec": json.dumps(self.e.spec.to_dict(), separators=(",", ":"))}
        if ev is not None and ev.version == version:
            meta |= {"accuracy": repr(ev.accuracy), "loss": repr(ev.loss), "metrics": json.dumps(ev.metrics),
                     "evaluated_samples": str(ev.samples)}
        return meta

    def write_best_model(self) -> str | None:
        """OUT/model-best.safetensors: the best evaluated model, as a standard state_dict (model_files).

        Returns the file name, or None before any evaluation.
        """
        e = self.e
        assert e.out_dir is not None
        best = e.evaluator.best_model()
        if best is None:
            return None
        ev, flat = best
        path = e.out_dir / BEST_MODEL_FILE
        # The evaluator's replica: the run's module, integer buffers as built (they never change there).
        if not write_model(path, e.evaluator.model.state_dict(), flat, self._model_metadata(ev, ev.version)):
            return None
        log.info("best model (version %d, %s %s) written to %s", ev.version, e.evaluator.primary,
                 ev.score(e.evaluator.primary), path)
        return path.name

    def write_final_model(self, final: Evaluation | None) -> str | None:
        """OUT/model-final.safetensors: the global model as the run ends, whatever it scores."""
        e = self.e
        assert e.out_dir is not None
        version, flat = e.state.snapshot(torch.float32)
        path = e.out_dir / FINAL_MODEL_FILE
        if not write_model(path, e.evaluator.model.state_dict(), flat, self._model_metadata(final, version)):
            return None
        log.info("final model (version %d) written to %s", version, path)
        return path.name
