"""What the run tells people: status, summary, and the files written at its end."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hermes.common import readable_json
from hermes.common.atomic_write import write_atomic
from hermes.common.config import RunConfig
from hermes.common.task import Task
from hermes.common.task_registry import effective_target
from hermes.server.engine.counters import Counters
from hermes.server.engine.goals import Goals
from hermes.server.engine.kafka import KafkaPublisher
from hermes.server.engine.ports import CheckpointView, RunControl
from hermes.server.engine.run_clock import RunClock
from hermes.server.engine.screening import Screening
from hermes.server.engine.start_gate import StartGate
from hermes.server.engine.telemetry import Telemetry
from hermes.server.evaluator import Evaluation, Evaluator
from hermes.server.model_files import BEST_MODEL_FILE, FINAL_MODEL_FILE, write_model
from hermes.server.registry import Registry
from hermes.server.state import ModelState

log = logging.getLogger(__name__)

__all__ = ["BEST_MODEL_FILE", "FINAL_MODEL_FILE", "Reporting"]


class Reporting:
    """Reads the parts it is built with; writes only OUT's files."""

    def __init__(self, config: RunConfig, task: Task, *, state: ModelState, run_clock: RunClock, goals: Goals,
                 evaluator: Evaluator, registry: Registry, start_gate: StartGate, screening: Screening,
                 counters: Counters, kafka: KafkaPublisher, telemetry: Telemetry, run: RunControl,
                 epoch_progress: Callable[[], float], local_data: bool, out_dir: Path | None) -> None:
        self.config = config
        self.task = task
        self.state = state
        self.spec = state.spec
        self.run_clock = run_clock
        self.goals = goals
        self.evaluator = evaluator
        self.registry = registry
        self.start_gate = start_gate
        self.screening = screening
        self.counters = counters
        self.kafka = kafka
        self.telemetry = telemetry
        self.run = run
        self.epoch_progress = epoch_progress
        self.local_data = local_data
        self.out_dir = out_dir
        # The checkpointer, once the app has opened one (Engine.attach_checkpoints).
        self.checkpoints: CheckpointView | None = None
        # The federated evaluation, where the run has one (its latest round beside the central evaluation).
        self.federated: Any = None

    def status(self) -> dict[str, Any]:
        ev = self.evaluator.latest
        best = self.evaluator.best
        goals, run, checkpoints = self.goals, self.run, self.checkpoints
        return {
            "preset": self.config.preset,
            "sync": self.config.sync,
            "model_version": self.state.version,
            "elapsed_seconds": self.run_clock.elapsed(),
            # Server restarts: not counted in elapsed_seconds (training seconds).
            "downtime_seconds": round(self.run_clock.downtime_seconds, 3),
            "epoch_progress": round(self.epoch_progress(), 4),
            "task": self.task.name,
            # Where training samples live: "server" (shards) or "local" (task.local_data on each agent).
            "data_location": "local" if self.local_data else "server",
            # Shard record bytes sent to agents: by the data plane, plus what agents read from Kafka.
            "shard_bytes": sum(self.counters.shard_bytes.values())
            + sum(w.shard_bytes.get("kafka", 0) for w in self.registry.all()),
            "evaluation": None if ev is None else {
                "version": ev.version, "accuracy": ev.accuracy, "loss": ev.loss, "metrics": ev.metrics, "at": ev.at,
            },
            "workers_active": len(self.registry.active_ids()),
            # Before min_workers have registered no work is handed out (engine/start_gate.py).
            "start_gate": self.start_gate.status(),
            "heterogeneity": self.registry.heterogeneity(),
            "workloads": {
                r.id: {"name": r.name, "dss": r.workload_history[-1][1], "batch_size": r.workload_history[-1][2],
                       "accumulation": r.accumulation}
                for r in self.registry.all() if r.state == "active" and r.workload_history
            },
            "workers_total": len(self.registry.all()),
            "stopping": run.stopping,
            "stop_reason": run.stop_reason,
            "outcome": goals.outcome(run.stopping),
            "target_accuracy": self.config.target_accuracy,
            "target": None if (t := effective_target(self.config)) is None else f"{t[0]}={t[1]:g}",
            "budget_reached": goals.budget_reached,
            # early_stop.patience ran out: which metric, its best and where (the final model is that one).
            "early_stopped": goals.early_stopped,
            "target_reached_at": None if goals.target_reached is None else goals.target_reached.public(),
            "best_metric": self.evaluator.primary,
            "best_accuracy": None if best is None else best.accuracy,
            "best_metrics": None if best is None else best.metrics,
            "best_version": None if best is None else best.version,
            # Set by the checkpointer when this run was resumed from a checkpoint.
            "resumed_from": None if checkpoints is None else checkpoints.resumed_from,
            "last_checkpoint_version": None if checkpoints is None else checkpoints.last_version,
            "screening": self.screening.public(),
            **({} if self.federated is None else {"federated_evaluation": self.federated.latest}),
        }

    def summary(self) -> dict[str, Any]:
        ev = self.evaluator.latest
        if self.goals.early_stopped is not None and self.evaluator.best is not None:
            ev = self.evaluator.best  # the final model is the best one (write_final_model)
        workers = self.registry.all()
        return {
            **self.status(),
            # Over every worker of the run: at shutdown the active ones have left.
            "heterogeneity": self.registry.heterogeneity(active_only=False),
            "config": self.config.model_dump(),
            "model": self.spec.to_dict() | {"entries": len(self.spec.entries)},
            "model_updates": self.state.version,
            "messages_total": sum(self.counters.messages.values()),
            "messages_by_type": dict(self.counters.messages),
            # Requests an agent did not send because another carried them (combine_messages).
            "carried_by_type": dict(self.counters.carried),
            "bytes_received_total": sum(w.server_bytes_in for w in workers),
            "bytes_sent_total": sum(w.server_bytes_out for w in workers),
            "final_accuracy": None if ev is None else ev.accuracy,
            "final_loss": None if ev is None else ev.loss,
            "final_metrics": None if ev is None else ev.metrics,
            "evaluations": [
                {"version": x.version, "accuracy": x.accuracy, "loss": x.loss, "metrics": x.metrics,
                 "elapsed": round(x.at - self.run_clock.started_at, 3), "seconds": round(x.seconds, 6)}
                for x in self.evaluator.history
            ],
            **({} if self.federated is None else {"federated_evaluations": self.federated.history}),
            "workers": [w.public() for w in workers],
            "data_plane": self.kafka.info(),
            "shard_bytes_by_source": {"zmq": sum(self.counters.shard_bytes.values()),
                                      "kafka": sum(w.shard_bytes.get("kafka", 0) for w in workers)},
        }

    def finish(self) -> dict[str, Any]:
        """The run's end: a last evaluation, the summary, the final and the best model written to OUT."""
        # The current model, whatever it scores: the best one is reported beside it, not instead.
        final = self.evaluator.evaluate_now()
        summary = self.summary()
        self.telemetry.emit("run_end", version=self.state.version, accuracy=final.accuracy, loss=final.loss,
                            metrics=final.metrics, stop_reason=self.run.stop_reason,
                            best_version=summary["best_version"], best_accuracy=summary["best_accuracy"])
        if self.out_dir is not None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            summary["best_model_file"] = self.write_best_model()
            summary["final_model_file"] = self.write_final_model(final)
            write_atomic(self.out_dir / "server_summary.json", readable_json.dumps(summary))
        self.telemetry.events.close()
        return summary

    def _model_metadata(self, ev: Evaluation | None, version: int) -> dict[str, str]:
        meta = {"version": str(version),
                # Which network: parameter names and shapes, the task and its fingerprint.
                "spec": json.dumps(self.spec.to_dict(), separators=(",", ":"))}
        if ev is not None and ev.version == version:
            meta |= {"accuracy": repr(ev.accuracy), "loss": repr(ev.loss), "metrics": json.dumps(ev.metrics),
                     "evaluated_samples": str(ev.samples)}
        return meta

    def write_best_model(self) -> str | None:
        """OUT/model-best.safetensors: the best evaluated model, as a standard state_dict (model_files).

        Returns the file name, or None before any evaluation.
        """
        assert self.out_dir is not None
        best = self.evaluator.best_model()
        if best is None:
            return None
        ev, flat = best
        path = self.out_dir / BEST_MODEL_FILE
        # The evaluator's replica: the run's module, integer buffers as built (they never change there).
        if not write_model(path, self.evaluator.model.state_dict(), flat, self._model_metadata(ev, ev.version)):
            return None
        log.info("best model (version %d, %s %s) written to %s", ev.version, self.evaluator.primary,
                 ev.score(self.evaluator.primary), path)
        return path.name

    def write_final_model(self, final: Evaluation | None) -> str | None:
        """OUT/model-final.safetensors: the global model as the run ends, whatever it scores; after an early
        stop, the best model instead (the run stopped because the models after it were no better)."""
        assert self.out_dir is not None
        version, flat = self.state.snapshot(torch.float32)
        best = self.evaluator.best_model() if self.goals.early_stopped is not None else None
        if best is not None:
            final, flat = best
            version = final.version
        path = self.out_dir / FINAL_MODEL_FILE
        if not write_model(path, self.evaluator.model.state_dict(), flat, self._model_metadata(final, version)):
            return None
        log.info("final model (version %d) written to %s", version, path)
        return path.name
