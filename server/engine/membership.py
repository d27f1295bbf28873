"""Who trains and with how much work: joins, leaves, rejoins after a resume, memory caps, resizes."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from hermes.common.config import RunConfig
from hermes.common.messages import CycleReport, KafkaRanges, WorkReply
from hermes.common.policies.allocation import Allocator, AllocatorStateError, CycleObservation, Resize, Workload
from hermes.common.policies.allocation.memory_model import fit_memory_model, max_batch_for_memory
from hermes.common.shards import Assignment, ShardQueue, shards_for
from hermes.server.auth import ReplayGuard
from hermes.server.engine.claims import Claims
from hermes.server.engine.collective import Collective
from hermes.server.engine.kafka import KafkaPublisher
from hermes.server.engine.local import LocalAccount
from hermes.server.engine.ports import RunControl
from hermes.server.engine.run_clock import RunClock
from hermes.server.engine.telemetry import Telemetry
from hermes.server.metrics import ServerMetrics
from hermes.server.registry import Registry, WorkerRecord
from hermes.server.shardstore import ShardStore

if TYPE_CHECKING:
    from hermes.server.engine.policies import Policies

log = logging.getLogger(__name__)

# A worker name held by another agent process that was heard from this
# recently is refused (registry.NameInUse); the server sets it to a few
# heartbeat intervals, so a crashed agent's restart takes its name back soon.
TAKEOVER_AFTER = 15.0


class Membership:
    """Built with what it moves: the registry, the shard queue (or the local account), the policies."""

    def __init__(self, config: RunConfig, *, policies: Policies, registry: Registry, queue: ShardQueue,
                 shards: ShardStore, validation_shards: ShardStore, local: LocalAccount | None,
                 kafka: KafkaPublisher, collective: Collective, replay: ReplayGuard, telemetry: Telemetry,
                 metrics: ServerMetrics, run_clock: RunClock, run: RunControl,
                 takeover_after: float = TAKEOVER_AFTER) -> None:
        self.config = config
        self.policies = policies
        self.registry = registry
        self.queue = queue
        self.shards = shards
        self.validation_shards = validation_shards
        # Device-local data (task.local_data): None when the server's shards feed the run.
        self.local = local
        self.kafka = kafka
        self.collective = collective
        self.replay = replay
        self.telemetry = telemetry
        self.metrics = metrics
        self.run_clock = run_clock
        self.run = run
        # Adds a federated evaluation request to an assignment (server/engine/federated_eval.py); None: never.
        self.stamp_work: Callable[[str, WorkReply], WorkReply] | None = None
        # The last assignments handed to each worker (the one it trains and the
        # one it prefetched): requeued if the worker is lost.
        self.outstanding: dict[str, list[tuple[int, ...]]] = {}
        # Workers a resumed checkpoint's allocator state still counts, until they register again.
        self.awaiting_rejoin: set[str] = set()
        self.awaiting_since = 0.0
        self.takeover_after = takeover_after
        # Bounds on what workers claim (engine.claims); set by the engine.
        self.claims: Claims | None = None
        # Workers by state, counted when scraped: a count set at every join and leave was a pass over
        # every worker each time, O(N^2) over a 10,000-device simulation's joins.
        for state in ("active", "left", "lost"):
            metrics.workers.labels(state=state).set_function(functools.partial(self.count_workers, state))

    @property
    def allocator(self) -> Allocator:
        return self.policies.allocator

    def register(self, name: str, **info: Any) -> tuple[WorkerRecord, bool]:
        self.collective.admit(name)  # GroupFull before anything is recorded
        rec, rejoined = self.registry.register(name, takeover_after=self.takeover_after, **info)
        if self.local is not None:
            self.local.declare(rec.id, rec.local_samples)
        self.awaiting_rejoin.discard(rec.id)
        # A new secret: sessions signed with the old one are gone, and a previous
        # incarnation's unfinished shards will not be finished by it.
        self.replay.forget(rec.id)
        self.requeue_outstanding(rec.id)
        self.policies.sync.on_join(rec.id)
        self.allocator.join(rec.id, rec.declared_capacity)
        self.apply_memory_limits(rec)
        elapsed = self.run_clock.elapsed()
        self.record_workload(rec, elapsed, self.allocator.workload(rec.id))
        # Hints by key only: nothing a client sends is written verbatim to the event log.
        facts = {k: v for k, v in info.items() if k not in ("hints", "name_key", "join_cap")}
        self.telemetry.emit("join", worker=rec.id, name=name, rejoined=rejoined, hints=sorted(rec.hints)[:32],
                            **facts)
        # Policies that split a fixed total (static, the global batch) move the others too.
        self.apply_resizes(self.allocator.rebalance(), elapsed)
        return rec, rejoined

    def expect_rejoin(self, worker_ids: Iterable[str]) -> None:
        """Workers whose allocation a resumed checkpoint restored: they hold it until they register again."""
        self.awaiting_rejoin = set(worker_ids)
        self.awaiting_since = self.run_clock.clock.time()

    def forget_unreturned(self, timeout: float, now: float | None = None) -> list[str]:
        """Restored workers not registered again ``timeout`` seconds after the resume: the allocator forgets them.

        Until then they count as members (an agent reconnecting to the
        restarted server keeps its workload); a worker that never comes back
        would otherwise hold the policies that wait for every member's
        measurements, and its share of a global batch, for good.
        """
        now = self.run_clock.clock.time() if now is None else now
        if not self.awaiting_rejoin or now - self.awaiting_since <= timeout:
            return []
        gone, self.awaiting_rejoin = sorted(self.awaiting_rejoin), set()
        for wid in gone:
            self.allocator.forget(wid)
        self.apply_resizes(self.allocator.rebalance(), self.run_clock.elapsed(now))
        self.telemetry.emit("restored_workers_forgotten", workers=gone, timeout=timeout)
        return gone

    async def leave(self, worker_id: str, reason: str, *, state: str = "left") -> bool:
        """The worker said goodbye (``left``) or went silent (``lost``); False when it was not active.

        The caller then folds what the strategy releases (a barrier need not wait for it).
        """
        rec = self.registry.get(worker_id)
        if rec is None or rec.state != "active":
            return False
        rec.state = state
        await self.collective.member_gone(rec)
        requeued = self.requeue_outstanding(worker_id)
        self.policies.sync.on_leave(worker_id)
        # Its cycle times no longer describe the cluster the median is taken over.
        self.allocator.forget(worker_id)
        self.apply_resizes(self.allocator.rebalance(), self.run_clock.elapsed())
        self.telemetry.emit("leave", worker=worker_id, reason=reason, state=state, requeued_shards=requeued)
        return True

    def learning_rate(self, effective_batch_size: int) -> float:
        return self.policies.lr.rate(effective_batch_size, lambda: sum(
            self.allocator.workload(w).effective_batch_size for w in self.registry.active_ids()))

    def assign(self, worker: WorkerRecord, keep: int = 2) -> WorkReply:
        """The next assignment of a worker, with a federated evaluation request where one is open (``stamp_work``)."""
        work = self._assign(worker, keep)
        return work if self.stamp_work is None else self.stamp_work(worker.id, work)

    def _assign(self, worker: WorkerRecord, keep: int) -> WorkReply:
        """The next assignment of a worker: its workload, and whole shards for what its carry does not cover."""
        wl = self.allocator.workload(worker.id)
        if self.local is not None:
            return self._assign_local(worker, self.local, wl)
        # Whole shards, while a workload is any number of samples: the agent
        # trains exactly ``cycle_samples`` and carries the rest into its next
        # cycle. The server keeps the same account (the credit), so it hands
        # out only what the carry does not cover and no sample is skipped.
        need = wl.dss - worker.sample_credit
        if need > 0:
            assignment = self.queue.take(shards_for(need, self.config.shard_size))
        else:
            assignment = Assignment(epoch=self.queue.epoch, shards=())
        given = sum(self.shards.samples(s) for s in assignment.shards)
        # Never negative: short of data the agent trains what it has and carries nothing.
        worker.sample_credit = max(0, worker.sample_credit + given - wl.dss)
        self.note_assignment(worker.id, assignment.shards, keep)
        lr = self.learning_rate(wl.effective_batch_size)
        handed = (self.claims.on_assign(worker.id, wl.dss, batch_size=wl.batch_size, accumulation=wl.accumulation,
                                        lr=lr) if self.claims is not None else None)
        work = WorkReply(epoch=assignment.epoch, shards=list(assignment.shards), batch_size=wl.batch_size,
                         cycle_samples=wl.dss, accumulation=wl.accumulation,
                         lr=lr, data=self.kafka.ranges("train", assignment.shards), assignment=handed)
        self.telemetry.emit("assignment", worker=worker.id, epoch=assignment.epoch, shards=list(assignment.shards),
                         dss=wl.dss, batch_size=wl.batch_size, accumulation=wl.accumulation, lr=work.lr)
        return work

    def _assign_local(self, worker: WorkerRecord, local: LocalAccount, wl: Workload) -> WorkReply:
        """Device-local data: the same workload, as a count of samples the agent draws from its own set."""
        epoch = local.take(wl.dss)
        lr = self.learning_rate(wl.effective_batch_size)
        handed = (self.claims.on_assign(worker.id, wl.dss, batch_size=wl.batch_size, accumulation=wl.accumulation,
                                        lr=lr) if self.claims is not None else None)
        work = WorkReply(epoch=epoch, shards=[], local_samples=wl.dss, batch_size=wl.batch_size, cycle_samples=wl.dss,
                         accumulation=wl.accumulation, lr=lr, data=KafkaRanges(source="local"), assignment=handed)
        self.telemetry.emit("assignment", worker=worker.id, epoch=epoch, shards=[], local_samples=wl.dss,
                         dss=wl.dss, batch_size=wl.batch_size, accumulation=wl.accumulation, lr=work.lr)
        return work

    def note_assignment(self, worker_id: str, shards: tuple[int, ...], keep: int = 2) -> None:
        recent = self.outstanding.setdefault(worker_id, [])
        recent.append(shards)
        # Requesting assignment k means k-2 is trained (one trains, one is prefetched); with
        # n assignments per request, the n of the request and the one in training.
        del recent[:-keep]

    def requeue_outstanding(self, worker_id: str) -> list[int]:
        """A departed worker's unfinished shards go back to the front of the queue."""
        shards = [s for a in self.outstanding.pop(worker_id, []) for s in a]
        if shards:
            self.queue.requeue(shards)
        return shards

    def observe_cycle(self, worker: WorkerRecord, report: CycleReport, *, on_push: bool = False) -> None:
        """Record one local training cycle (``on_push``: riding on its own update's push); feed the
        allocator; resize stragglers."""
        elapsed = self.run_clock.elapsed()
        claimed = report.compute_seconds
        if self.claims is not None:
            report = self.claims.cycle(worker.id, report, on_push=on_push)
        cycle = report.fields()
        worker.record_cycle(elapsed, cycle)
        wid = worker.id
        # A clamped report's event keeps the agent's own seconds too: the elapsed-time floor counts the link's
        # transfers in its window, so on a slow link it raises honest cycles (bsp on lte, fp32: every cycle, 1.3x;
        # docs/simulation.md, "the lte stall"), and the step times read from the events must not be the bound's.
        own = {} if report.compute_seconds == claimed else {"claimed_compute_seconds": claimed}
        self.telemetry.emit("cycle", worker=wid, elapsed=elapsed, **cycle, **own)
        self.allocator.observe(wid, CycleObservation(report.dss, report.batch_size, report.compute_seconds,
                                                     report.accumulation))
        self.apply_resizes(self.allocator.rebalance(), elapsed)

    def set_memory_profile(self, worker: WorkerRecord, profile: list[list[int | float]]) -> None:
        """A worker's measured [batch, bytes] pairs: its batch cap follows, and so may the others' sizes."""
        worker.hints["memory_profile"] = profile
        self.apply_memory_limits(worker)
        self.apply_resizes(self.allocator.rebalance(), self.run_clock.elapsed())

    def count_workers(self, state: str) -> float:
        return float(sum(1 for w in self.registry.all() if w.state == state))

    def apply_memory_limits(self, rec: WorkerRecord) -> None:
        """Caps from the memory a worker declared at registration."""
        memory = rec.hints.get("memory_available_bytes")
        if not isinstance(memory, int) or memory <= 0:
            return
        # A quarter of the device's free memory for the samples of one
        # cycle (two buffers with prefetching): the DSS cap of Hermes Sec. IV-A.
        # Local data: the server's validation samples (held out of its test data) have the same shapes.
        per_sample = (self.validation_shards if self.local is not None else self.shards).sample_bytes() or 1
        self.allocator.set_memory_limit(rec.id, max(self.config.shard_size, memory // (8 * per_sample)))
        profile = rec.hints.get("memory_profile")
        if not profile:
            return
        try:
            # OmniLearn Eq. 9: training memory is m0 + m1*b, fitted on the worker's own measurements.
            m0, m1 = fit_memory_model([(int(batch_size), float(m)) for batch_size, m in profile])
            b_max = max_batch_for_memory(m0, m1, memory * self.config.batch_bounds.memory_fraction)
        except (TypeError, ValueError) as exc:
            # The profile is logged here, not in the event: it is the worker's own input.
            log.warning("worker %s: unusable memory profile %r: %s", rec.id, profile, exc)
            self.telemetry.emit("memory_profile_rejected", worker=rec.id, error=str(exc)[:200])
            return
        self.allocator.set_batch_limit(rec.id, b_max)
        self.telemetry.emit("memory_model", worker=rec.id, m0=round(m0), m1=round(m1, 3), b_max=b_max,
                            budget=int(memory * self.config.batch_bounds.memory_fraction))

    def record_workload(self, rec: WorkerRecord, elapsed: float, wl: Workload) -> None:
        rec.workload_history.append((elapsed, wl.dss, wl.batch_size))
        rec.accumulation = wl.accumulation

    def apply_resizes(self, resizes: dict[str, Resize], elapsed: float) -> None:
        if self.run.stopping:
            return  # at shutdown everyone leaves: there is no work left to re-split
        for resized_id, resize in resizes.items():
            rec = self.registry.get(resized_id)
            if rec is None or rec.state != "active":
                continue
            wl = resize.workload
            if rec.workload_history and rec.workload_history[-1][1:] == (wl.dss, wl.batch_size) \
                    and rec.accumulation == wl.accumulation:
                continue  # e.g. a joining worker, recorded at registration
            self.record_workload(rec, elapsed, wl)
            self.telemetry.emit("resize", worker=resized_id, name=rec.name, kind=resize.kind, dss=wl.dss,
                                batch_size=wl.batch_size, accumulation=wl.accumulation, **resize.detail)

    def validation_shards_for(self, worker: WorkerRecord) -> list[int]:
        """A fixed local validation split per worker (its gate's data), spread over the validation set."""
        if self.local is not None:
            return []  # the agent holds its gate's validation out of its own data
        n = self.validation_shards.num_shards
        k = min(n, shards_for(self.config.zscore.validation_samples, self.config.shard_size))
        start = (int(worker.id.lstrip("w") or 0) * k) % n
        return [(start + i) % n for i in range(k)]

    # ---- checkpoints ----------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The shard queue, the shards each worker holds, the allocator's workloads, the workers' identities."""
        return {
            "queue": self.queue.state(),
            "outstanding": {w: [list(a) for a in lst] for w, lst in self.outstanding.items()},
            "allocator": self.allocator.state_dict(),
            "workers": self.registry.identities(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Shards outstanding at the checkpoint go back to the queue; the allocator keeps its workloads."""
        self.queue.restore(state["queue"])
        for shards in state.get("outstanding", {}).values():
            self.queue.requeue([s for a in shards for s in a])
        self._load_allocator(state.get("allocator"), state["workers"])
        self.registry.restore(state["workers"])

    def _load_allocator(self, state: Mapping[str, Any] | None, workers: list[dict[str, Any]]) -> None:
        if state is None:  # checkpoints of older servers saved no state for most policies
            return
        try:
            self.allocator.load_state_dict(state)
        except AllocatorStateError as exc:
            # The run config may change on resume (another policy, other bounds):
            # the saved workloads then mean nothing here, and allocation starts afresh.
            log.warning("allocator state not restored, allocation starts afresh: %s", exc)
            self.telemetry.emit("allocator_state_discarded", error=str(exc)[:500])
            return
        # Every known id, not only those active at the checkpoint: one restored by an
        # earlier resume may be a member still, and forgetting a stranger is a no-op.
        self.expect_rejoin(str(w["id"]) for w in workers)
