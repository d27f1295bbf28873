"""The edge agent's life: register, train until told to stop, register again when the server forgets us.

Each registration is a ``Session`` (worker id, token, connections,
heartbeat, prefetcher, collective group); the first one also fixes the
``Job`` (model, run config, precision, gate). Training is one loop
(``loop.run_cycles``) with the topology plugged in (``topology.PushPull``
for the parameter server, ``topology.AllReduce`` for the collective); the
trainer takes one optimizer step function with the all-reduce as its
gradient hook. The agent is the loop's host (``topology.TopologyHost``):
the loop returns why it stopped and the agent records it.
"""

from __future__ import annotations

import logging
import secrets
import sys
import threading
import time
from typing import Any

import torch
import zmq
from pydantic import ValidationError

from hermes.client.collective import settle_abandoned
from hermes.client.cores import UsableCores, usable_cores
from hermes.client.local_data import LocalSet
from hermes.client.memory_probe import available_memory_bytes, memory_profile
from hermes.client.name_key import name_key
from hermes.client.options import AgentOptions
from hermes.client.preflight import data_plane_problem
from hermes.client.session import AgentStats, Job, Session
from hermes.client.shard_fetch import ShardFetcher, ShardStats, records_to_tensors
from hermes.client.topology import AllReduce, PushPull
from hermes.client.trainer import resolve_device
from hermes.client.transport import (
    ControlClient,
    RemoteError,
    RequestCancelled,
    RunOver,
    ServerUnreachable,
    StopRequested,
    TrafficCounter,
    tls_context,
)
from hermes.common.control_messages import Hints, RegisterRequest
from hermes.common.messages import CycleReport, describe
from hermes.common.policies import base as registry
from hermes.common.task import Task, fingerprint
from hermes.common.task_registry import check_task, resolve_task
from hermes.common.wire import ErrorCode

__all__ = ["Agent", "AgentOptions", "AgentStats", "DataPlaneUnreachable", "NameTaken"]

log = logging.getLogger(__name__)


# Data-plane errors after which registering again is the cure: the server
# forgot this worker (marked lost, or restarted with new secrets) or is restarting.
_REJOIN_CODES = frozenset({ErrorCode.UNAUTHORIZED.value, ErrorCode.UNKNOWN_WORKER.value,
                           ErrorCode.UNAVAILABLE.value, ErrorCode.REPLAY.value})


class DataPlaneUnreachable(ServerUnreachable):
    """Registered, but the data plane the server advertises cannot be reached from here."""


class NameTaken(RemoteError):
    """Another live agent is registered under this agent's name."""


class Agent:
    def __init__(self, options: AgentOptions) -> None:
        self.options = options
        # Tells this process's registrations from another agent's under the same name.
        self.instance = secrets.token_hex(8)
        # Device-local data (task.local_data): built before registering, so a broken one never
        # leaves a half-registered worker; None: the agent trains on the server's shards.
        self.local: LocalSet | None = None
        self.stop_requested = threading.Event()
        # Cuts data-plane waits short: set on stop and when the server forgot us.
        self.cancel = threading.Event()
        tls = tls_context(options.ssl_ca_certfile, options.ssl_certfile, options.ssl_keyfile)
        self.control = ControlClient(options.server, retries=options.connect_retries, stop=self.stop_requested,
                                     join_token=options.join_token, ssl_context=tls)
        # One attempt each: heartbeats and the goodbye must not hang in backoff.
        self.quick_control = ControlClient(options.server, retries=0, timeout=5.0, ssl_context=tls)
        self.rejoins = 0
        # Set by run(): the cores this process may use, and the torch threads it trains with.
        self.cores = UsableCores(count=1, affinity=1, quota=None)
        self.threads = options.threads or 1
        self.traffic = TrafficCounter()
        self.shard_stats = ShardStats()
        self.stats = AgentStats(started=time.perf_counter())
        self.stop_reason = ""
        self._ctx = zmq.Context()
        self._last_progress = 0.0
        self._last_log_line = 0.0
        # The model this registration's pushes are measured from (from-baseline presets: Hermes Alg. 2's
        # w0 for an agent that joined at the start) and its version; the gate's validation split, kept over rejoins.
        self.baseline: torch.Tensor | None = None
        self.baseline_version = 0
        self.validation: tuple[torch.Tensor, torch.Tensor] | None = None
        # The current registration; None before the first one.
        self.session: Session | None = None
        # What registration states about the task (set by _load_task).
        self.task_name: str | None = None
        self.task_fingerprint: str | None = None
        # Proves this agent's name to the server (client/name_key.py): read or made at the first registration.
        self._name_key: str | None = None

    def request_stop(self, reason: str) -> None:
        self.stop_reason = reason
        self.stop_requested.set()
        self.cancel.set()

    @property
    def worker_name(self) -> str:
        """The agent's name (loop.Host: what ``task.local_eval_data`` is called with)."""
        return self.options.name

    def run(self) -> AgentStats:
        opts = self.options
        self.cores = usable_cores()
        self.threads = opts.threads or self.cores.count
        torch.set_num_threads(self.threads)
        log.info("%d torch threads (%s; usable cores %d: affinity %d, cgroup quota %s)", self.threads,
                 "forced" if opts.threads else "the usable cores", self.cores.count, self.cores.affinity,
                 "none" if self.cores.quota is None else f"{self.cores.quota:g}")
        device = resolve_device(opts.device)
        task, model = self._load_task()
        if task.local_data is not None and self.local is None:
            self.local = LocalSet.build(task, opts.name)
            log.info("device-local data: %d samples from %s.local_data(%r); nothing is fetched from the server",
                     len(self.local), task.name or "the task", opts.name)
        session = self._register(device)
        self._check_data_plane(session)
        job = Job.from_registration(session, device, opts.slowdown, task, model,
                                   slowdown_mode=opts.slowdown_mode, nominal_sample_ms=opts.nominal_sample_ms)
        if self.local is not None:
            self.local.configure(job.config, gate=job.gate is not None)
        log.info("registered as %s (%s); preset=%s task=%s model=%s (%d params) precision=%s device=%s data plane %s",
                 session.worker_id, opts.name, job.config.preset, task.name, job.spec.name, job.spec.numel,
                 job.precision_choice.describe() if job.precision_choice else job.precision, device,
                 session.address)
        if job.data_source.source == "kafka":
            log.info("shard records from Kafka at %s (the data plane is the fallback)",
                     opts.kafka_bootstrap or job.data_source.bootstrap)
        try:
            self._train_rejoining(job, device)
        finally:
            session = self.session or session
            session.close()
            self.cancel.clear()  # the goodbye below must not be cut short
            self.report(job, session, final=True)
            session.data.close()
            try:
                self.quick_control.leave(session.worker_id, session.token)
            except Exception as exc:  # the server may be gone already
                log.info("could not say goodbye to the server: %s", exc)
            self._ctx.term()
            # A generation abandoned on the server's word may still hold a failing collective.
            settle_abandoned(job.config.collective.timeout_seconds + 5.0)
            self.progress(session, force=True)
            if opts.progress and sys.stderr.isatty():
                sys.stderr.write("\n")
        return self.stats

    def _load_task(self) -> tuple[Task, torch.nn.Module]:
        """The agent's task, checked before registering (TaskError: a one-line start-up error).

        Built with the server's run config (the builtin task reads its model
        and dataset keys); the reference defaults to the one the server names.
        """
        config = self.control.run_config()
        ref = self.options.task if self.options.task is not None else config.task
        task = resolve_task(ref, config)
        model = check_task(task, config, role="agent", worker=self.options.name)
        self.task_name, self.task_fingerprint = task.name, fingerprint(model)
        return task, model

    def _register(self, device: torch.device, previous: Session | None = None) -> Session:
        """A new registration (with backoff while a restarting server comes back)."""
        hints: dict[str, Any] = {"torch": torch.__version__, "memory_available_bytes": available_memory_bytes(device),
                                 "instance": self.instance, **self.cores.hints()}
        if self.options.cores:
            hints["cores"] = self.options.cores
        if self._name_key is None:
            self._name_key = self.options.name_key or name_key(self.options.server, self.options.name)
        try:
            request = RegisterRequest(name=self.options.name, threads=self.threads, device=device.type,
                                      name_key=self._name_key,
                                      slowdown=self.options.slowdown, hints=Hints(**hints), task=self.task_name,
                                      task_fingerprint=self.task_fingerprint,
                                      local_samples=None if self.local is None else len(self.local))
        except ValidationError as exc:  # a bad --name, --threads or --slowdown: said before asking the server
            raise ValueError(f"registration: {describe(exc)}") from None
        waited_for_name = False
        while True:
            try:
                reg = self.control.register(request)
                break
            except RemoteError as exc:
                if exc.code == "http_410":
                    self.stop_reason = "the server's run is over"
                    raise RunOver(f"the server's run is over ({exc.message})") from None
                if exc.code == "http_409" and "in use by another live agent" in exc.message:
                    if waited_for_name or exc.retry_after is None:
                        raise NameTaken(exc.code, exc.message) from None
                    # The holder may be this agent's own earlier process, killed without a
                    # goodbye: once it has been silent long enough the server hands the name over.
                    waited_for_name = True
                    log.warning("%s; waiting %.0fs in case it is a previous run of this agent that died",
                                exc.message, exc.retry_after)
                    if self.stop_requested.wait(exc.retry_after + 0.5):
                        raise StopRequested("stopped while waiting for the worker name") from None
                    continue
                raise
        self.session = Session(reg, quick_control=self.quick_control, context=self._ctx, traffic=self.traffic,
                               shard_stats=self.shard_stats, cancel=self.cancel,
                               request_timeout=self.options.request_timeout,
                               kafka_bootstrap=self.options.kafka_bootstrap, on_lost=self._registration_lost,
                               previous=previous, local=self.local)
        return self.session

    def _check_data_plane(self, session: Session) -> None:
        """The first registration: prove the advertised data plane answers, else say --advertise-host."""
        if self.options.data_plane_check_timeout <= 0:
            return
        problem = data_plane_problem(session.address, self.options.data_plane_check_timeout)
        if problem is None:
            return
        session.close()
        session.data.close()
        try:
            self.quick_control.leave(session.worker_id, session.token)
        except (RemoteError, ServerUnreachable, StopRequested) as exc:
            log.info("could not say goodbye to the server: %s", exc)
        self._ctx.term()
        raise DataPlaneUnreachable(f"{problem}; if this agent runs on another machine than the server, start the "
                                   "server with --advertise-host set to an address of the server this machine "
                                   "can reach (and check that a firewall lets the data port through)")

    def _registration_lost(self, reason: str) -> None:
        log.warning("%s; will register again", reason)
        self.cancel.set()

    def _train_rejoining(self, job: Job, device: torch.device) -> None:
        """Train, registering again whenever the server lost us or restarted."""
        while True:
            session = self.session
            assert session is not None, "registered before training"
            try:
                self._begin(job, session)
                self._train(job, session, device)
                return
            except RequestCancelled:
                if self.stop_requested.is_set():
                    return  # SIGTERM during a wait: the step is abandoned
                reason = "registration lost"
            except RemoteError as exc:
                if exc.code not in _REJOIN_CODES:
                    raise
                reason = str(exc)
            except ServerUnreachable as exc:
                reason = str(exc)
            if self.stop_requested.is_set():
                return
            self._rejoin(session, device, reason)
            # A new registration starts from the global model: moments gathered before are stale.
            job.trainer.reset_state()

    def _rejoin(self, old: Session, device: torch.device, reason: str) -> None:
        self.rejoins += 1
        if self.rejoins > self.options.max_rejoins:
            raise ServerUnreachable(f"gave up after {self.options.max_rejoins} re-registrations; last: {reason}")
        log.warning("registering again (%s)", reason)
        old.close()
        old.data.close()
        self.cancel.clear()
        session = self._register(device, previous=old)
        log.info("registered again as %s (%s)", session.worker_id, "rejoined" if session.reg.rejoined else "new")

    def _begin(self, job: Job, session: Session) -> None:
        """After each registration: catch up with the global model (whatever this agent trained
        meanwhile is superseded by it), then start prefetching."""
        # From-baseline presets: a late joiner or a rejoin measures from the model it starts from, which
        # the server keeps as its base (server/engine/bases.py), not from the run's first model.
        session.pull(job.trainer, self.stats, force=True, base=job.from_baseline)
        self.baseline, self.baseline_version = session.base, session.version
        if job.gate is not None and self.validation is None:
            self.validation = self._fetch_validation(job, session)
        session.prefetcher.start()

    def _train(self, job: Job, session: Session, device: torch.device) -> None:
        if registry.get("allocation", job.config.allocation).needs_memory_profile:
            # The allocator caps each worker's batch by its memory (OmniLearn Eq. 9).
            self.report(job, session, memory_profile=memory_profile(job.trainer.model, job.example, device,
                                                                    loss=job.trainer.loss_fn))
        if session.rendezvous:
            # A broken group re-forms through the regroup call, not by registering again.
            reason = AllReduce(self, job, session, session.rendezvous, self.control).train()
        else:
            reason = PushPull(self, job, session, baseline=self.baseline, baseline_version=self.baseline_version,
                              validation=self.validation,
                              max_cycles=self.options.max_cycles, request_timeout=self.options.request_timeout,
                              max_nonfinite=self.options.max_nonfinite_cycles).train()
        if reason:  # "": the operator's stop, whose reason request_stop recorded
            self.stop_reason = reason

    def _fetch_validation(self, job: Job, session: Session) -> tuple[torch.Tensor, torch.Tensor]:
        """The gate's fixed validation split: from Kafka when the server published it there
        (device-local data: held out of the local set, nothing fetched)."""
        if self.local is not None:
            return self.local.validation()
        fetcher = ShardFetcher(session.data, self.shard_stats, kafka_bootstrap=self.options.kafka_bootstrap,
                               should_stop=self.stop_requested.is_set)
        try:
            fetched = fetcher.fetch(job.validation_shards, job.data_source, "validation")
        finally:
            fetcher.close()
        samples = None if fetched is None else records_to_tensors(fetched[0])
        if samples is None:  # asked to stop meanwhile; the loop will not run a cycle
            return torch.zeros((0,)), torch.zeros((0,))
        return samples

    # ---- what the loop and the topologies call ---------------------------------

    def report(self, job: Job, session: Session, *, final: bool = False, cycle: CycleReport | None = None,
               memory_profile: list[tuple[int, int]] | None = None) -> bool:
        """Send the stats (and a cycle); True when the server's reply says the run is stopping."""
        timings = job.precision_choice.report() if job.precision_choice is not None else None
        return session.report(self.stats, job.precision, final=final, cycle=cycle, memory_profile=memory_profile,
                              precision_timings=timings)

    def report_if_due(self, job: Job, session: Session) -> None:
        if time.monotonic() - session.last_report < job.config.stats_interval_seconds:
            return
        if session.outbox is None:
            self.report(job, session)
            return
        # combine_messages: the next push or work request carries them (one goes out every cycle).
        timings = job.precision_choice.report() if job.precision_choice is not None else None
        session.outbox.set_stats(session.stats_body(self.stats, job.precision, precision_timings=timings))

    def note_skipped_cycle(self, job: Job, session: Session, cycle: CycleReport) -> None:
        """A cycle the gate did not push: the server's straggler detector needs every cycle."""
        if session.outbox is None:
            self.report(job, session, cycle=cycle)
        else:
            session.outbox.add_cycle(cycle)

    def slowdown_now(self) -> float:
        origin = self.options.schedule_origin
        return self.options.slowdown_at(
            time.time() - origin if origin is not None else time.perf_counter() - self.stats.started)

    def progress(self, session: Session, force: bool = False) -> None:
        if not self.options.progress:
            return
        now = time.perf_counter()
        if not force and now - self._last_progress < 1.0:
            return
        self._last_progress = now
        st = self.stats
        wall = max(1e-9, now - st.started)
        line = (f"[{self.options.name}] v{session.version} cycles={st.cycles} samples={st.samples} "
                f"loss={st.last_loss:.4f} compute={st.compute_seconds / wall:.0%} "
                f"wait={(st.wait_seconds + session.prefetcher.wait_seconds) / wall:.0%} "
                f"applied={st.applied}/{st.pushes} skipped={st.gate_skips} "
                f"sent={self.traffic.bytes_sent / 1e6:.1f}MB")
        if sys.stderr.isatty():
            sys.stderr.write("\r" + line[:200])
            sys.stderr.flush()
        elif force or now - self._last_log_line >= 5.0:
            self._last_log_line = now
            log.info("%s", line)
