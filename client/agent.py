"""The edge agent's loop: register, pull, train, (gate), push, pull, report.

The server's sync strategy decides when a push lands (now, or at a barrier);
the agent simply waits for the push reply, then pulls the model if it is
newer than the one it trained from. With the z-score gate (Hermes) the agent
only pushes after cycles whose validation loss improved significantly, and
otherwise keeps training its own model on the next assignment.
"""

from __future__ import annotations

import logging
import math
import sys
import threading
import time
import zlib
from dataclasses import dataclass, field

import numpy as np
import torch
import zmq

from hermes.client.collective import (
    CollectiveError,
    CollectiveGroup,
    Rendezvous,
    settle_abandoned,
)
from hermes.client.heartbeat import Heartbeat
from hermes.client.memory_probe import available_memory_bytes, memory_profile
from hermes.client.prefetch import (
    Prefetcher,
    ShardFetcher,
    ShardStats,
    StopSignal,
    Work,
)
from hermes.client.trainer import LocalTrainer, resolve_device, resolve_precision
from hermes.client.transport import (
    ControlClient,
    DataClient,
    RemoteError,
    RequestCancelled,
    RunOver,
    ServerUnreachable,
    StopRequested,
    TrafficCounter,
    tls_context,
)
from hermes.common.config import RunConfig
from hermes.common.gate import GateConfig, ZScoreGate
from hermes.common.signing import ServerClock
from hermes.common.tensors import ModelSpec, build_from_spec
from hermes.common.wire import ErrorCode, MsgType, dtype_from_name

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AgentOptions:
    server: str
    name: str
    threads: int = 1
    slowdown: float = 1.0
    device: str = "auto"
    request_timeout: float = 30.0
    connect_retries: int = 8
    progress: bool = True
    max_cycles: int | None = None
    # (seconds since start, slowdown) steps: a device whose speed changes mid-run.
    slowdown_schedule: tuple[tuple[float, float], ...] = ()
    # Unix time the schedule's seconds count from (the testbed passes one
    # origin to every agent so their phases line up); None: the agent's start.
    schedule_origin: float | None = None
    # Kafka bootstrap address to use instead of the one the server names
    # (the broker may be reachable under another name from this device).
    kafka_bootstrap: str | None = None
    # Compute capacity this device declares (cores, or FLOPs): the static
    # allocation policy's c_k (OmniLearn Eq. 4a). None: the server decides.
    cores: float | None = None
    # Security: the operator's join token; TLS for the control plane.
    join_token: str | None = field(default=None, repr=False)
    ssl_ca_certfile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    # Registrations after the first (server restarted, or it marked us lost) before giving up.
    max_rejoins: int = 100

    def slowdown_at(self, elapsed: float) -> float:
        factor = self.slowdown
        for at, step_factor in self.slowdown_schedule:
            if elapsed >= at:
                factor = step_factor
        return factor


@dataclass
class AgentStats:
    cycles: int = 0
    samples: int = 0
    compute_seconds: float = 0.0
    wait_seconds: float = 0.0
    pushes: int = 0
    applied: int = 0
    rejected: int = 0
    pulls: int = 0
    last_loss: float = float("nan")
    gate_skips: int = 0
    started: float = field(default_factory=time.perf_counter)


# Data-plane errors after which registering again is the cure: the server
# forgot this worker (marked lost, or restarted with new secrets) or is restarting.
_REJOIN_CODES = frozenset({ErrorCode.UNAUTHORIZED.value, ErrorCode.UNKNOWN_WORKER.value,
                           ErrorCode.UNAVAILABLE.value, ErrorCode.REPLAY.value})


def _finite_or_none(v: float | None) -> float | None:
    return v if v is not None and math.isfinite(v) else None


class Agent:
    def __init__(self, options: AgentOptions) -> None:
        self.options = options
        self.stop_requested = threading.Event()
        # Cuts data-plane waits short: set on stop and when the server forgot us.
        self.cancel = threading.Event()
        tls = tls_context(options.ssl_ca_certfile, options.ssl_certfile, options.ssl_keyfile)
        self.control = ControlClient(options.server, retries=options.connect_retries, stop=self.stop_requested,
                                     join_token=options.join_token, ssl_context=tls)
        # One attempt each: heartbeats and the goodbye must not hang in backoff.
        self.quick_control = ControlClient(options.server, retries=0, timeout=5.0, ssl_context=tls)
        self.rejoins = 0
        self.heartbeat: Heartbeat | None = None
        self.traffic = TrafficCounter()
        self.stats = AgentStats()
        self.stop_reason = ""
        self._ctx = zmq.Context()
        self._last_report = 0.0
        self._last_progress = 0.0
        self._carry: tuple[np.ndarray, np.ndarray] | None = None
        # Topology collective: the current generation's group and the all-reduce bytes of earlier ones.
        self.group: CollectiveGroup | None = None
        self._reduced_before = 0

    def request_stop(self, reason: str) -> None:
        self.stop_reason = reason
        self.stop_requested.set()
        self.cancel.set()

    def _register(self) -> dict:
        try:
            reg = self.control.register(
                name=self.options.name, threads=self.options.threads, device=self.device.type,
                slowdown=self.options.slowdown,
                hints=self._hints(),
            )
        except RemoteError as exc:
            if exc.code == "http_410":
                self.stop_reason = "the server's run is over"
                raise RunOver(f"the server's run is over ({exc.message})") from None
            raise
        self.worker_id, self.token = reg["worker_id"], reg["token"]
        self.rendezvous = reg.get("collective")
        self.clock = ServerClock(reg.get("server_time_ms"))
        self.max_message_bytes = int(reg.get("max_message_bytes", 0)) or 2**62
        self.heartbeat = Heartbeat(self.quick_control, self.worker_id, self.token,
                                   interval=float(reg.get("heartbeat_interval_seconds", 5.0)),
                                   on_lost=self._registration_lost, on_reply=self._heartbeat_reply)
        self.heartbeat.start()
        return reg

    def _hints(self) -> dict:
        hints = {"torch": torch.__version__, "memory_available_bytes": available_memory_bytes(self.device)}
        if self.options.cores:
            hints["cores"] = self.options.cores
        return hints

    def _heartbeat_reply(self, body: dict) -> None:
        """Heartbeat thread: the server says our collective generation broke (we may be stuck in
        gloo's recv from a dead peer until the group timeout): give up on it now."""
        broken = body.get("collective_broken")
        group = self.group
        if isinstance(broken, int) and group is not None and group.rv.generation == broken:
            group.abort(f"the server reports that collective generation {broken} broke")

    def _registration_lost(self, reason: str) -> None:
        log.warning("%s; will register again", reason)
        self.cancel.set()

    def _data_client(self, address: str) -> DataClient:
        return DataClient(address, self.worker_id, self.token, timeout=self.options.request_timeout,
                          counter=self.traffic, context=self._ctx, clock=self.clock,
                          max_message_bytes=self.max_message_bytes, cancel=self.cancel)

    def run(self) -> AgentStats:
        opts = self.options
        torch.set_num_threads(opts.threads)
        device = self.device = resolve_device(opts.device)
        reg = self._register()
        spec = ModelSpec.from_dict(reg["model_spec"])
        self.config = RunConfig(**reg["run_config"])
        self.precision = resolve_precision(self.config.precision, device)
        log.info("registered as %s (%s); preset=%s model=%s (%d params) precision=%s device=%s data plane %s",
                 self.worker_id, opts.name, self.config.preset, spec.name, spec.numel,
                 self.precision, device, reg["data_plane"])
        self.trainer = LocalTrainer(
            build_from_spec(spec), lr=self.config.lr, momentum=self.config.momentum,
            weight_decay=self.config.weight_decay, device=device, precision=self.precision,
            slowdown=opts.slowdown, seed=zlib.crc32(self.worker_id.encode()),
        )
        self.wire_dtype = dtype_from_name(self.config.wire_dtype)
        self.spec = spec
        address = reg["data_plane"]
        self.data = self._data_client(address)
        self.shard_stats = ShardStats()
        self.prefetcher = self._new_prefetcher(address)
        source = reg.get("data_source") or {"source": "zmq"}
        if source.get("source") == "kafka":
            log.info("shard records from Kafka at %s (the data plane is the fallback)",
                     opts.kafka_bootstrap or source.get("bootstrap"))
        self.gate = (
            ZScoreGate(GateConfig(window=self.config.zscore.window, alpha=self.config.zscore.alpha,
                                  beta=self.config.zscore.beta, lam=self.config.zscore.lam))
            if self.config.gate == "zscore" else None
        )
        # Loss-weighted aggregation (Hermes Alg. 2) takes G = w_local - w0,
        # the change since the initial model; the other rules take the
        # change since the last pulled model.
        self.from_baseline = self.config.aggregation == "loss"
        self.baseline: torch.Tensor | None = None
        self.version = 0
        self.validation = None
        self._validation_source = (reg["validation_shards"], source)
        try:
            self._loop_rejoining()
        finally:
            self.prefetcher.stop()
            if self.heartbeat is not None:
                self.heartbeat.stop()
            self.cancel.clear()  # the goodbye below must not be cut short
            self._report(final=True)
            self.data.close()
            try:
                self.quick_control.leave(self.worker_id, self.token)
            except Exception as exc:  # the server may be gone already
                log.info("could not say goodbye to the server: %s", exc)
            self._ctx.term()
            # A generation abandoned on the server's word may still hold a failing collective.
            settle_abandoned(self.config.collective.timeout_seconds + 5.0)
            self._progress(force=True)
            if opts.progress and sys.stderr.isatty():
                sys.stderr.write("\n")
        return self.stats

    def _new_prefetcher(self, address: str) -> Prefetcher:
        return Prefetcher(lambda: self._data_client(address), stats=self.shard_stats,
                          kafka_bootstrap=self.options.kafka_bootstrap)

    def _loop_rejoining(self) -> None:
        """The training loop, registering again whenever the server lost us or restarted."""
        while True:
            try:
                self._begin()
                self._train()
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
            self._rejoin(reason)

    def _train(self) -> None:
        if self.config.allocation in ("static", "pcontrol", "partition"):
            # Those policies cap each worker's batch by its memory (OmniLearn Eq. 9).
            self._report(memory_profile=memory_profile(self.trainer.model, self.spec.input_shape,
                                                       self.spec.num_classes, self.device))
        if self.rendezvous:
            # A broken group re-forms through the regroup call, not by registering again.
            self._collective_loop(Rendezvous.from_reply(self.rendezvous), self.device)
        else:
            self._loop()

    def _rejoin(self, reason: str) -> None:
        self.rejoins += 1
        if self.rejoins > self.options.max_rejoins:
            raise ServerUnreachable(f"gave up after {self.options.max_rejoins} re-registrations; last: {reason}")
        log.warning("registering again (%s)", reason)
        self.prefetcher.stop()
        if self.heartbeat is not None:
            self.heartbeat.stop()
        self.data.close()
        self.cancel.clear()
        self._carry = None  # the server's account of carried samples starts over too
        # Retries with backoff while a restarting server comes back.
        reg = self._register()
        self.data = self._data_client(reg["data_plane"])
        log.info("registered again as %s (%s)", self.worker_id, "rejoined" if reg["rejoined"] else "new")
        previous = self.prefetcher
        self.prefetcher = self._new_prefetcher(reg["data_plane"])
        self.prefetcher.wait_seconds = previous.wait_seconds
        self.prefetcher.first_wait_seconds = previous.first_wait_seconds

    def _begin(self) -> None:
        """After each registration: catch up with the global model (whatever this agent trained
        meanwhile is superseded by it), then start prefetching."""
        self.version, self.base = self._pull(force=True)
        if self.baseline is None:
            self.baseline = self.base
        if self.gate is not None and self.validation is None:
            self.validation = self._fetch_validation(*self._validation_source)
        self.prefetcher.start()

    def _loop(self) -> None:
        while not self.stop_requested.is_set():
            if self.options.max_cycles is not None and self.stats.cycles >= self.options.max_cycles:
                self.stop_reason = f"max_cycles={self.options.max_cycles} reached"
                return
            item = self.prefetcher.next()
            if isinstance(item, StopSignal):
                if item.error is not None:
                    raise item.error
                self.stop_reason = item.reason
                return
            if self._cycle(item):
                return
            self._progress()
            if time.monotonic() - self._last_report >= self.config.stats_interval_seconds:
                self._report()

    def _collective_loop(self, rv: Rendezvous, device: torch.device) -> None:
        """Topology 'collective': every step all-reduces weighted gradients with the other ranks.

        The server sizes the work and hears each cycle's compute time; rank 0
        sends it a copy of the model every ``eval_interval_seconds`` (and at
        the end) for evaluation. Stopping is agreed in the all-reduce itself.
        When the group breaks (a peer died or timed out) the agent asks the
        server for the next generation and goes on with the survivors, unless
        regrouping is off: then the CollectiveError ends the agent.
        """
        self._power = 1.0
        while True:
            group: CollectiveGroup | None = None
            try:
                group = self.group = CollectiveGroup(rv, device)
                self._collective_generation(group, rv)
                return
            except CollectiveError as exc:
                if not self.config.collective.regroup:
                    raise
                failure = exc
            finally:
                if group is not None:
                    self._reduced_before += group.reduced_bytes
                    self.group = None
                    group.close()
            rv = self._regroup(rv, failure)
            if rv is None:
                return

    def _regroup(self, rv: Rendezvous, failure: CollectiveError) -> Rendezvous | None:
        """The next generation's rendezvous from the server; None when the run is over meanwhile."""
        log.warning("collective generation %d broke (%s); asking the server for the next one", rv.generation, failure)
        try:
            # The server may wait for a slow survivor up to the group timeout past its window.
            body = self.control.regroup(self.worker_id, self.token, rv.generation,
                                        wait_seconds=self.config.collective.regroup_seconds + rv.timeout_seconds)
        except RemoteError as exc:
            if exc.code == "http_410":
                self.stop_reason = f"the server's run is over ({exc.message})"
                return None
            raise CollectiveError(f"generation {rv.generation} broke ({failure}) and the server refused a "
                                  f"regroup: {exc.message}") from None
        except ServerUnreachable as exc:
            raise CollectiveError(f"generation {rv.generation} broke ({failure}) and the server cannot be "
                                  f"asked for the next one: {exc}") from None
        nxt = Rendezvous.from_reply(body)
        log.warning("joining collective generation %d as rank %d of %d", nxt.generation, nxt.rank, nxt.world_size)
        return nxt

    def _collective_generation(self, group: CollectiveGroup, rv: Rendezvous) -> None:
        """Train with one generation of the group until the ranks agree to stop (or it breaks)."""
        # Survivors may differ by a step (an all-reduce that completed on some
        # ranks only): rank 0's weights and fresh optimizer state on every rank
        # make the replicas identical again.
        self.trainer.optimizer.state.clear()
        group.broadcast_model(self.trainer.model)
        # The server folds rank 0's copies as deltas: the base is the model it holds now,
        # which an earlier rank 0 of an earlier generation may have sent.
        copied = self._server_model() if rv.rank == 0 else self.trainer.flat()
        last_copy = time.monotonic()
        while True:
            self.trainer.stop_requested = self.trainer.stop_requested or self.stop_requested.is_set()
            item = self.prefetcher.next()
            if isinstance(item, StopSignal):
                if item.error is not None and not isinstance(item.error, StopRequested):
                    raise item.error
                self.stop_reason = item.reason
                # Tell the others in the all-reduce they are waiting in: nobody hangs.
                group.reduce_gradients([p for p in self.trainer.model.parameters()], 0.0, True)
                return
            x, y = self._cycle_samples(item)
            steps = max(1, (item.cycle_samples or len(y)) // (item.batch_size * item.accumulation))
            self.trainer.set_lr(item.lr)
            self.trainer.slowdown = self._slowdown_now()
            result, waited, stop = self.trainer.train_cycle_collective(
                x, y, item.batch_size, item.accumulation, steps, group.reduce_gradients,
                weight=self.config.aggregation if self.config.aggregation in ("mean", "power") else "samples",
                power=self._power)
            if result.compute_seconds > 0 and result.samples:
                self._power = result.samples / result.compute_seconds  # DP-SGD Eq. 2, for EDP-SGD's weights
            st = self.stats
            st.cycles += 1
            st.samples += result.samples
            st.compute_seconds += result.compute_seconds
            st.wait_seconds += waited
            st.last_loss = result.loss
            cycle = {"dss": result.samples, "mbs": item.batch_size, "accumulation": item.accumulation,
                     "compute_seconds": result.compute_seconds, "decision": "always", "pushed": False,
                     "val_loss": None, "z": None, "alpha": None}
            if rv.rank == 0 and (stop or time.monotonic() - last_copy >= self.config.eval_interval_seconds):
                copied, last_copy = self._send_copy(copied), time.monotonic()
            if self._report(cycle=cycle):
                self.trainer.stop_requested = True  # said in the next all-reduce
            self._progress()
            if stop:
                self.stop_reason = self.stop_reason or "the collective group agreed to stop"
                return

    def _server_model(self) -> torch.Tensor:
        """The server's current model, without loading it (the group's replica is the one to train)."""
        reply = self.data.request(MsgType.PULL_MODEL, {"if_newer": False, "dtype": "float32"},
                                  model_version=self.version)
        if reply.payload is None:
            return self.trainer.flat()
        self.version = reply.header.model_version
        return reply.payload.flat().clone()

    def _send_copy(self, base: torch.Tensor) -> torch.Tensor:
        """Rank 0: the change since the last copy, folded by the server with weight 1 (it then holds our model)."""
        flat = self.trainer.flat()
        reply = self.data.request(
            MsgType.PUSH_UPDATE, {"samples": 1, "copy": True}, payload=(flat - base).to(self.wire_dtype),
            model_version=self.version, shapes=self.spec.shapes, idempotent=False,
        )
        if reply.header.body.get("status") == "applied":
            self.version = reply.header.model_version
            self.stats.pushes += 1
            self.stats.applied += 1
            return flat
        log.warning("model copy not applied: %s", reply.header.body.get("reason"))
        return base

    def _slowdown_now(self) -> float:
        origin = self.options.schedule_origin
        return self.options.slowdown_at(
            time.time() - origin if origin is not None else time.perf_counter() - self.stats.started)

    def _fetch_validation(self, shards: list[int], source: dict) -> tuple[np.ndarray, np.ndarray]:
        """The gate's fixed validation split: from Kafka when the server published it there."""
        fetcher = ShardFetcher(self.data, self.shard_stats, kafka_bootstrap=self.options.kafka_bootstrap,
                               should_stop=self.stop_requested.is_set)
        try:
            fetched = fetcher.fetch(shards, source, "validation")
        finally:
            fetcher.close()
        if fetched is None:  # asked to stop meanwhile; the loop will not run a cycle
            return np.zeros((0,)), np.zeros((0,))
        records, _ = fetched
        return np.concatenate([r.x for r in records]), np.concatenate([r.y for r in records])

    def _cycle(self, work: Work) -> bool:
        """Train on one assignment; push and pull if the gate says so. True when the server says stop."""
        self.trainer.set_lr(work.lr)
        self.trainer.slowdown = self._slowdown_now()
        x, y = self._cycle_samples(work)
        if len(y) == 0:
            log.warning("assignment of epoch %d holds no samples; asking for the next one", work.epoch)
            return False
        result = self.trainer.train_cycle(x, y, work.batch_size, work.accumulation)
        st = self.stats
        st.cycles += 1
        st.samples += result.samples
        st.compute_seconds += result.compute_seconds
        st.last_loss = result.loss
        cycle = {"dss": result.samples, "mbs": work.batch_size, "accumulation": work.accumulation,
                 "compute_seconds": result.compute_seconds,
                 "decision": "always", "pushed": True, "val_loss": None, "z": None, "alpha": None}
        if self.gate is not None:
            assert self.validation is not None
            val_loss = self.trainer.evaluate(*self.validation)
            decision = self.gate.observe(val_loss)
            st.gate_skips += not decision.push
            cycle.update(decision=decision.reason, pushed=decision.push, val_loss=_finite_or_none(val_loss),
                         z=_finite_or_none(decision.z), alpha=decision.alpha)
            if not decision.push:
                # Keep training the local model on fresh data; tell the
                # server how long the cycle took (its straggler detector
                # needs every cycle, not only pushed ones).
                self._report(cycle=cycle)
                return False
        reference = self.baseline if self.from_baseline else self.base
        delta = (self.trainer.flat() - reference).to(self.wire_dtype)
        t0 = time.perf_counter()
        reply = self.data.request(
            MsgType.PUSH_UPDATE,
            {"samples": result.samples, "steps": result.steps, "loss": result.loss,
             "compute_seconds": result.compute_seconds, "cycle": cycle},
            payload=delta, model_version=self.version, shapes=self.spec.shapes,
            # A barrier may hold the reply for as long as the slowest worker's cycle.
            timeout=max(600.0, self.options.request_timeout), idempotent=False,
        )
        st.wait_seconds += time.perf_counter() - t0
        st.pushes += 1
        body = reply.header.body
        if body.get("status") == "applied":
            st.applied += 1
        else:
            st.rejected += 1
            log.debug("update rejected: %s", body.get("reason"))
        if body.get("stop"):
            self.stop_reason = "server asked to stop"
            return True
        self.version, self.base = self._pull(force=False)
        return False

    def _cycle_samples(self, work: Work) -> tuple[np.ndarray, np.ndarray]:
        """Exactly the samples this cycle asks for: the carry from the last cycle first, then the new shards.

        Shards are whole while workloads are not; what is left over is trained
        next cycle (the server counts it the same way and sends less).
        """
        parts = [p for p in (self._carry, (work.x, work.y) if work.x is not None else None) if p is not None]
        if not parts:
            return np.zeros((0,)), np.zeros((0,), dtype=np.int64)
        x = np.concatenate([p[0] for p in parts]) if len(parts) > 1 else parts[0][0]
        y = np.concatenate([p[1] for p in parts]) if len(parts) > 1 else parts[0][1]
        n = len(y) if work.cycle_samples is None else min(work.cycle_samples, len(y))
        self._carry = (x[n:], y[n:]) if n < len(y) else None
        return x[:n], y[:n]

    def _pull(self, force: bool) -> tuple[int, torch.Tensor]:
        t0 = time.perf_counter()
        reply = self.data.request(MsgType.PULL_MODEL, {"if_newer": not force, "dtype": "float32"},
                                  model_version=getattr(self, "version", 0))
        self.stats.wait_seconds += time.perf_counter() - t0
        self.stats.pulls += 1
        if reply.payload is None:
            # Unchanged: keep training from our own model against the same base.
            return self.version, self.base
        flat = reply.payload.flat().clone()  # own it: the frame buffers go away
        self.trainer.load(flat)
        return reply.header.model_version, flat

    def _report(self, final: bool = False, cycle: dict | None = None,
                memory_profile: list[tuple[int, int]] | None = None) -> bool:
        """Send the stats (and a cycle); True when the server's reply says the run is stopping."""
        self._last_report = time.monotonic()
        st = self.stats
        body = {
            "samples": st.samples,
            "compute_seconds": st.compute_seconds,
            "wait_seconds": st.wait_seconds + self.prefetcher.wait_seconds,
            "prefetch_wait_seconds": self.prefetcher.wait_seconds,
            "prefetch_wait_steady_seconds": self.prefetcher.steady_wait_seconds,
            **self.shard_stats.report(),
            "bytes_sent": self.traffic.bytes_sent,
            "bytes_received": self.traffic.bytes_received,
            "precision": self.precision,
            "final": final,
        }
        if cycle is not None:
            body["cycle"] = cycle
        if memory_profile is not None:
            body["memory_profile"] = [list(p) for p in memory_profile]
        if self.rendezvous:
            body["collective_bytes"] = self._reduced_before + (self.group.reduced_bytes if self.group else 0)
        try:
            reply = self.data.request(MsgType.REPORT_STATS, body, timeout=5.0 if final else None)
            return bool(reply.header.body.get("stop"))
        except Exception as exc:
            if not final:
                raise
            log.info("final stats report not delivered: %s", exc)
        return False

    def _progress(self, force: bool = False) -> None:
        if not self.options.progress:
            return
        now = time.perf_counter()
        if not force and now - self._last_progress < 1.0:
            return
        self._last_progress = now
        st = self.stats
        wall = max(1e-9, now - st.started)
        line = (f"[{self.options.name}] v{self.version} cycles={st.cycles} samples={st.samples} "
                f"loss={st.last_loss:.4f} compute={st.compute_seconds / wall:.0%} "
                f"wait={(st.wait_seconds + self.prefetcher.wait_seconds) / wall:.0%} "
                f"applied={st.applied}/{st.pushes} skipped={st.gate_skips} "
                f"sent={self.traffic.bytes_sent / 1e6:.1f}MB")
        if sys.stderr.isatty():
            sys.stderr.write("\r" + line[:200])
            sys.stderr.flush()
        elif force or now - getattr(self, "_last_log_line", 0.0) >= 5.0:
            self._last_log_line = now
            log.info("%s", line)
