"""The agent's training loop: one cycle after another, until someone says stop.

One loop for both topologies. What differs is how a cycle's work reaches
the others, and that plugs in as a ``Topology``:

- parameter server (``topology.PushPull``): train the assignment, ask the
  gate, push the change, pull the newer model;
- collective (``topology.AllReduce``): every optimizer step all-reduces the
  weighted gradients (the trainer's gradient hook), rank 0 sends the server
  a copy of the model now and then, and stopping is agreed in the all-reduce.

Read top to bottom, a cycle is: may we go on? → the next assignment (or the
prefetcher's stop) → exactly this cycle's samples → train → hand the result
to the topology → progress line.

The loop knows its runner only as a ``Host`` (its stats, slowdown, reports
and progress line); a hook that ends the loop returns why, and the loop
returns that to the agent, which records it.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Protocol

from hermes.client.federated_eval import DeviceEvaluator
from hermes.client.prefetch import StopSignal, Work
from hermes.client.trainer import CycleResult, GradHook
from hermes.common.messages import CycleReport

if TYPE_CHECKING:
    from hermes.client.session import AgentStats, Job, Session

log = logging.getLogger(__name__)


class Host(Protocol):
    """What the loop needs from the agent that runs it: its account and its reports."""

    stats: AgentStats

    def slowdown_now(self) -> float:
        """The emulated slowdown factor for the next cycle."""
        ...

    def report_if_due(self, job: Job, session: Session) -> None:
        """Send (or, combining messages, queue) the stats when the interval is up."""
        ...

    def progress(self, session: Session) -> None:
        """The progress line, at most once a second."""
        ...

    @property
    def worker_name(self) -> str:
        """The agent's name (what ``task.local_eval_data`` is called with)."""
        ...


# A hook's answer: None, go on; a string, stop, for that reason ("" when the stop was the
# operator's and its reason is already recorded).
Stop = str | None


class Topology(Protocol):
    # Runs between backward and the optimizer step (the all-reduce); None: a local step.
    grad_hook: GradHook | None

    def start_cycle(self) -> Stop:
        """Before taking the next assignment."""
        ...

    def steps(self, work: Work, samples: int) -> int | None:
        """Optimizer steps this cycle; None: one pass over the samples."""
        ...

    def stop_signal(self, signal: StopSignal) -> str:
        """The prefetcher has no more work: raise its error, or tell the others and say why."""
        ...

    def finish_cycle(self, work: Work, result: CycleResult) -> Stop:
        """After training: exchange the result."""
        ...


def cycle_record(work: Work, result: CycleResult, *, pushed: bool, decision: str = "always",
                 val_loss: float | None = None, z: float | None = None, alpha: float | None = None) -> CycleReport:
    """One cycle as the server's allocators and event log see it (the gate's fields when it decided)."""
    return CycleReport(dss=result.samples, batch_size=work.batch_size, accumulation=work.accumulation,
                       compute_seconds=result.compute_seconds, decision=decision, pushed=pushed,
                       val_loss=val_loss, z=z, alpha=alpha, federated=result.federated, assignment=work.assignment)


def run_cycles(host: Host, job: Job, session: Session, topology: Topology) -> str:
    """Cycles until a hook says stop; returns why ("" when the operator's stop ended them)."""
    try:
        return _cycles(host, job, session, topology)
    finally:
        cpu, slept = job.trainer.between_cycles
        log.info("between cycles: %.3fs of CPU, %.3fs slept to slow it with the device", cpu, slept)


def _cycles(host: Host, job: Job, session: Session, topology: Topology) -> str:
    trainer, stats = job.trainer, host.stats
    task = job.task
    device_eval = (DeviceEvaluator(task, host.worker_name)
                   if task is not None and task.local_eval_data is not None else None)
    while True:
        stop = topology.start_cycle()
        if stop is not None:
            return stop
        work = session.prefetcher.next()
        if isinstance(work, StopSignal):
            return topology.stop_signal(work)
        x, y = session.cycle_samples(work)
        if len(y) == 0 and topology.grad_hook is None:
            # Nothing to push; a collective rank still trains it (it must join every all-reduce).
            log.warning("assignment of epoch %d holds no samples; asking for the next one", work.epoch)
            host.progress(session)
            host.report_if_due(job, session)
            continue
        # Before training: the model is the global one pulled last (the server's request is for it).
        federated = None if device_eval is None else device_eval.answer(work.federated_round, trainer, session.version)
        trainer.set_lr(work.lr)
        trainer.slowdown = host.slowdown_now()
        result = trainer.train_cycle(x, y, work.batch_size, work.accumulation,
                                     steps=topology.steps(work, len(y)), grad_hook=topology.grad_hook)
        if federated is not None:
            result = dataclasses.replace(result, federated=federated)
        stats.cycles += 1
        stats.samples += result.samples
        stats.compute_seconds += result.compute_seconds
        stats.wait_seconds += result.wait_seconds
        stats.last_loss = result.loss
        # The device's CPU between cycles (gate validation, encoding, rebase) is slowed like its training in
        # the nominal slowdown mode (common/pace.py); what it waited for replies is not device time.
        t0, cpu0, waited0 = time.perf_counter(), time.thread_time(), stats.wait_seconds
        stop = topology.finish_cycle(work, result)
        trainer.pace_overhead(t0, cpu0, stats.wait_seconds - waited0)
        if stop is not None:
            return stop
        host.progress(session)
