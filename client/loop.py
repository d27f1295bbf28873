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
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

from hermes.client.prefetch import StopSignal, Work
from hermes.client.trainer import CycleResult, GradHook

if TYPE_CHECKING:
    from hermes.client.agent import Agent
    from hermes.client.session import Job, Session

log = logging.getLogger(__name__)


class Topology(Protocol):
    # Runs between backward and the optimizer step (the all-reduce); None: a local step.
    grad_hook: GradHook | None

    def start_cycle(self) -> bool:
        """Before taking the next assignment; True: stop now."""
        ...

    def steps(self, work: Work, samples: int) -> int | None:
        """Optimizer steps this cycle; None: one pass over the samples."""
        ...

    def stop_signal(self, signal: StopSignal) -> None:
        """The prefetcher has no more work: raise its error, or record why and tell the others."""
        ...

    def finish_cycle(self, work: Work, result: CycleResult) -> bool:
        """After training: exchange the result; True: stop now."""
        ...


def cycle_record(work: Work, result: CycleResult, *, pushed: bool) -> dict[str, Any]:
    """One cycle as the server's allocators and event log see it (gate fields filled by the gate)."""
    return {"dss": result.samples, "mbs": work.batch_size, "accumulation": work.accumulation,
            "compute_seconds": result.compute_seconds, "decision": "always", "pushed": pushed,
            "val_loss": None, "z": None, "alpha": None}


def run_cycles(agent: Agent, job: Job, session: Session, topology: Topology) -> None:
    trainer, stats = job.trainer, agent.stats
    while True:
        if topology.start_cycle():
            return
        work = session.prefetcher.next()
        if isinstance(work, StopSignal):
            topology.stop_signal(work)
            return
        x, y = session.cycle_samples(work)
        if len(y) == 0 and topology.grad_hook is None:
            # Nothing to push; a collective rank still trains it (it must join every all-reduce).
            log.warning("assignment of epoch %d holds no samples; asking for the next one", work.epoch)
            agent.progress(session)
            agent.report_if_due(job, session)
            continue
        trainer.set_lr(work.lr)
        trainer.slowdown = agent.slowdown_now()
        result = trainer.train_cycle(x, y, work.batch_size, work.accumulation,
                                     steps=topology.steps(work, len(y)), grad_hook=topology.grad_hook)
        stats.cycles += 1
        stats.samples += result.samples
        stats.compute_seconds += result.compute_seconds
        stats.wait_seconds += result.wait_seconds
        stats.last_loss = result.loss
        if topology.finish_cycle(work, result):
            return
        agent.progress(session)
