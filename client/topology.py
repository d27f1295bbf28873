"""How a cycle's work reaches the others: the two topologies the loop plugs in.

``PushPull`` (topology ``ps``): the server's sync strategy decides when a
push lands (now, or at a barrier); the agent waits for the push reply, then
pulls the model if it is newer than the one it trained from. With the
z-score gate (Hermes) it only pushes after cycles whose validation loss
improved significantly, and otherwise keeps training its own model on the
next assignment.

``AllReduce`` (topology ``collective``): every optimizer step all-reduces
weighted gradients with the other ranks (the trainer's gradient hook). The
server sizes the work and hears each cycle's compute time; rank 0 sends it
a copy of the model every ``eval_interval_seconds`` (and at the end) for
evaluation. Stopping is agreed in the all-reduce itself. When the group
breaks (a peer died or timed out) the agent asks the server for the next
generation and goes on with the survivors, unless regrouping is off: then
the CollectiveError ends the agent.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Protocol

import torch

from hermes.client.collective import (
    CollectiveError,
    CollectiveGroup,
    GradientAllReduce,
    Rendezvous,
)
from hermes.client.loop import Host, Stop, cycle_record, run_cycles
from hermes.client.overlap import OverlappedPush
from hermes.client.prefetch import StopSignal, Work
from hermes.client.session import Job, Session, finite_or_none
from hermes.client.trainer import CycleResult, GradHook
from hermes.client.transport import ControlClient, DataClient, RemoteError, ServerUnreachable, StopRequested
from hermes.common.messages import (
    IN_FLIGHT,
    LOSS_NOT_FINITE,
    CycleReport,
    PullModel,
    PushReply,
    PushUpdate,
    parse_reply,
    request_body,
)
from hermes.common.policies.aggregation import AggregationRule
from hermes.common.policies.gate import GateDecision
from hermes.common.wire import Message, MsgType

log = logging.getLogger(__name__)


class LossNotFinite(Exception):
    """This agent's own training diverged: its loss is NaN or infinite, so its update is not worth sending."""


class TopologyHost(Host, Protocol):
    """What a topology needs from the agent beyond the loop's host: its stop flag and its reports."""

    # Set by an operator's stop (a signal, the Python API).
    stop_requested: threading.Event

    def report(self, job: Job, session: Session, *, cycle: CycleReport | None = None) -> bool:
        """Send the stats (and a cycle); True when the server's reply says the run is stopping."""
        ...

    def note_skipped_cycle(self, job: Job, session: Session, cycle: CycleReport) -> None:
        """A cycle the gate did not push: reported, or queued for the next message."""
        ...


# Generations in a row that broke before their first step, after which the agent gives up.
STILLBORN_GENERATIONS = 3


def judge_cycle(job: Job, validation: tuple[torch.Tensor, torch.Tensor] | None, work: Work,
                result: CycleResult) -> tuple[CycleReport, GateDecision | None, float | None]:
    """A trained cycle's record and, with the gate (Hermes Alg. 1), its decision and validation loss;
    no gate: always pushed (decision None). The agent's loop and the simulator (hermes.sim) both ask here."""
    if job.gate is None:
        return cycle_record(work, result, pushed=True), None, None
    assert validation is not None, "the gate's validation split is fetched when a session begins"
    val_loss = job.trainer.evaluate(*validation)
    decision = job.gate.observe(val_loss)
    cycle = cycle_record(work, result, pushed=decision.push, decision=decision.reason,
                         val_loss=finite_or_none(val_loss), z=finite_or_none(decision.z), alpha=decision.alpha)
    return cycle, decision, val_loss


def update_of(job: Job, reference: torch.Tensor | None, result: CycleResult,
              cycle: CycleReport, *, base_version: int | None = None) -> tuple[torch.Tensor, torch.Tensor, PushUpdate]:
    """The trained model, its change since ``reference`` in the wire dtype, and the push's body.

    ``reference``: Hermes Alg. 2's w0 when the rule weighs changes since the initial model
    (``job.from_baseline``), else the last pulled model; ``base_version``: the version of that w0,
    which the server folds a from-baseline update against (None for since-pull updates).
    """
    assert reference is not None, "a session pulls the model before its first cycle"
    local = job.trainer.flat()
    codec = None
    if job.push_codec is not None:
        # compression.push: the codec's bytes go out; the server decompresses before it screens or folds.
        encoded = job.push_codec.encode(local - reference, job.spec.shapes)
        delta, codec = encoded.data, encoded.spec
    else:
        delta = (local - reference).to(job.wire_dtype)
    if result.loss is not None and not math.isfinite(result.loss):
        # The server refuses such a push (PushUpdate.loss is Finite); say so here, in one line, before sending it.
        raise LossNotFinite(f"the local loss is {result.loss} after {result.steps} steps: training diverged "
                            "(try a lower lr)")
    update = PushUpdate(samples=result.samples, steps=result.steps, loss=result.loss,
                        compute_seconds=result.compute_seconds, cycle=cycle, base_version=base_version, codec=codec)
    return local, delta, update


class PushPull:
    """Topology ``ps``: gate, push the change, pull the newer model (overlapped with the next cycle
    under ``overlap_push``: client.overlap)."""

    def __init__(self, host: TopologyHost, job: Job, session: Session, *, baseline: torch.Tensor | None,
                 validation: tuple[torch.Tensor, torch.Tensor] | None, max_cycles: int | None,
                 request_timeout: float, baseline_version: int = 0, max_nonfinite: int = 3) -> None:
        self.host, self.job, self.session = host, job, session
        # Cycles in a row whose loss was not finite, and how many the agent bears before giving up.
        self.nonfinite_in_a_row, self.max_nonfinite = 0, max_nonfinite
        # Hermes Alg. 2's w0: the registration's base pull (server/engine/bases.py), its version; the gate's split.
        self.baseline, self.validation = baseline, validation
        self.baseline_version = baseline_version
        self.max_cycles, self.request_timeout = max_cycles, request_timeout
        self.grad_hook: GradHook | None = None
        # The config requires combine_messages with overlap_push; a server that does not combine
        # (an older one) cannot bring the model back in the push's reply.
        self.overlap = (OverlappedPush(session.data_client)
                        if job.config.overlap_push and session.outbox is not None else None)
        # overlap_pull: what is in flight is a pull asked for while the gate held, not a push.
        self.pulling = False

    def train(self) -> str:
        """The cycles of this session; returns why they stopped."""
        if self.overlap is None:
            return run_cycles(self.host, self.job, self.session, self)
        try:
            reason = run_cycles(self.host, self.job, self.session, self)
            if self.overlap.pending:
                # The last push counts; its reply may say stop, the loop is over anyway.
                reason = self._settle() or reason
            return reason
        finally:
            log.info("overlapped exchanges: %.2fs in flight, %.2fs waited for", self.overlap.exchange_seconds,
                     self.overlap.waited_seconds)
            self.overlap.close()

    def start_cycle(self) -> Stop:
        if self.host.stop_requested.is_set():
            return ""
        if self.max_cycles is not None and self.host.stats.cycles >= self.max_cycles:
            return f"max_cycles={self.max_cycles} reached"
        return None

    def steps(self, work: Work, samples: int) -> int | None:
        return None

    def stop_signal(self, signal: StopSignal) -> str:
        if signal.error is not None:
            raise signal.error
        return signal.reason

    def finish_cycle(self, work: Work, result: CycleResult) -> Stop:
        stop = self._exchange(work, result)
        if stop is None:
            self.host.report_if_due(self.job, self.session)
        return stop

    def _exchange(self, work: Work, result: CycleResult) -> Stop:
        """Push and pull if the gate says so; a reason when the server says stop."""
        host, job, session, st = self.host, self.job, self.session, self.host.stats
        trainer = job.trainer
        if result.loss is not None and not math.isfinite(result.loss):
            return self._drop_diverged(work, result)
        self.nonfinite_in_a_row = 0
        # overlap_push: once the push in flight is answered, rebase on its model first, so that the gate
        # judges, and the next push carries, the progress since that push on the newer model.
        if self.overlap is not None and self.overlap.pending:
            if not self.overlap.answered:
                # Not back yet: train on rather than wait; this cycle's progress goes with the next push.
                host.note_skipped_cycle(job, session, cycle_record(work, result, pushed=False, decision=IN_FLIGHT))
                return None
            stop = self._settle()
            if stop is not None:
                return stop
        cycle, decision, val_loss = judge_cycle(job, self.validation, work, result)
        if decision is not None:
            st.gate_skips += not decision.push
            if not decision.push:
                # Keep training the local model on fresh data; tell the server how long the
                # cycle took (its straggler detector needs every cycle, not only pushed ones).
                host.note_skipped_cycle(job, session, cycle)
                if decision.resync:
                    # zscore.resync_factor: the local model diverged; its progress is not worth keeping.
                    log.info("validation loss %.4g after %d silent cycles: the local model diverged, taking the "
                             "global model again", val_loss, decision.silent_cycles + 1)
                    session.pull(trainer, st, force=True)
                    trainer.reset_state()
                    st.resyncs += 1
                elif self.overlap is not None and job.config.overlap_pull:
                    self._pull_held()
                return None
        local, delta, update = update_of(job, self.baseline if job.from_baseline else session.base, result, cycle,
                                         base_version=self.baseline_version if job.from_baseline else None)
        # compression.push: the payload is the codec's bytes, whose spec (in the body) replaces the shapes.
        shapes = () if update.codec is not None else job.spec.shapes
        if session.outbox is not None:
            # combine_messages: the model comes back in the reply; pending cycles and stats go along.
            cycles, stats = session.outbox.take()
            update = update.model_copy(update={"pull": True, "pull_dtype": session.pull_dtype, "cycles": cycles,
                                               "stats": stats, "pull_codec": session.pull_codec})
        body = request_body(update)
        version = session.version

        def push(client: DataClient, timeout: float) -> Message:
            return client.request(MsgType.PUSH_UPDATE, body, payload=delta, model_version=version,
                                  shapes=shapes, timeout=timeout, idempotent=False)

        if self.overlap is not None:
            # No barrier holds an asynchronous push's reply: the agent's own request timeout applies.
            self.overlap.send(lambda client: push(client, self.request_timeout), pushed=local)
            return None
        t0 = time.perf_counter()
        # A barrier may hold the reply for as long as the slowest worker's cycle.
        reply = push(session.data, max(600.0, self.request_timeout))
        st.wait_seconds += time.perf_counter() - t0
        # The model the push was made from is the local model still (nothing trained since): the load's reset
        # check measures the pulled model's jump from it rather than flattening the model again.
        return self._receive(reply, pushed=None, local=local)

    def _drop_diverged(self, work: Work, result: CycleResult) -> Stop:
        """A cycle whose loss is NaN or infinite: not pushed (the server refuses such a push), the
        global model taken again; ``max_nonfinite`` in a row and the agent gives up (LossNotFinite)."""
        host, job, session, st = self.host, self.job, self.session, self.host.stats
        if self.overlap is not None and self.overlap.pending:
            stop = self._settle()  # its reply still counts; the model it brings is replaced below
            if stop is not None:
                return stop
        self.nonfinite_in_a_row += 1
        st.nonfinite_cycles += 1
        host.note_skipped_cycle(job, session, cycle_record(work, result, pushed=False, decision=LOSS_NOT_FINITE))
        if self.nonfinite_in_a_row >= self.max_nonfinite:
            raise LossNotFinite(f"the local loss was not finite in {self.nonfinite_in_a_row} cycles in a row (last "
                                f"{result.loss} after {result.steps} steps), each retried from the global model: "
                                "training diverges here (try a lower lr)")
        log.warning("local loss %s after %d steps: cycle dropped, taking the global model again (%d/%d in a row)",
                    result.loss, result.steps, self.nonfinite_in_a_row, self.max_nonfinite)
        session.pull(job.trainer, st, force=True)
        job.trainer.reset_state()
        return None

    def _pull_held(self) -> None:
        """overlap_pull: the gate held this cycle's change; ask for the newer model in the background. Its
        reply is rebased on like a push's, against the base the local model trained from, so every change
        not yet pushed stays on top of the newer model and goes with the next push."""
        assert self.overlap is not None
        session = self.session
        assert session.base is not None, "a session pulls the model before its first cycle"
        body = request_body(PullModel(if_newer=True, dtype=session.pull_dtype, codec=session.pull_codec))
        version, timeout = session.version, self.request_timeout

        def pull(client: DataClient) -> Message:
            return client.request(MsgType.PULL_MODEL, body, model_version=version, timeout=timeout)

        self.overlap.send(pull, pushed=session.base)
        self.pulling = True

    def _settle(self) -> Stop:
        """Take the overlapped push's reply (waiting for it if need be) and rebase on its model."""
        assert self.overlap is not None
        waited = self.overlap.waited_seconds
        reply, pushed = self.overlap.take()
        self.host.stats.wait_seconds += self.overlap.waited_seconds - waited
        if self.pulling:
            self.pulling = False
            self.host.stats.pulls += 1
            self.session.load_pull_reply(self.job.trainer, reply, pushed)
            return None
        return self._receive(reply, pushed=pushed)

    def _receive(self, reply: Message, pushed: torch.Tensor | None, local: torch.Tensor | None = None) -> Stop:
        """Count a push's reply and load (``pushed``: rebase on) the model it brings; a reason: stop. ``local``:
        the local model as a flat vector, when the caller has it and nothing has trained since."""
        session, st, trainer = self.session, self.host.stats, self.job.trainer
        st.pushes += 1
        answer = parse_reply(PushReply, reply.header.body, "PUSH_REPLY")
        if answer.status == "applied":
            st.applied += 1
            if "quarantine" in st.last_refusal:
                log.info("the server applies this worker's updates again (%d refused while it was quarantined)",
                         st.quarantined_refusals)
            st.last_refusal = ""
        else:
            st.rejected += 1
            reason = answer.reason or ""
            # Not a judgement of the update: the run stopped while it was on its way.
            st.refused += answer.status == "rejected" and reason != "run is stopping"
            if "quarantine" in reason:
                st.quarantined_refusals += 1
                if reason != st.last_refusal:  # said once per new reason, not on every push
                    log.info("the server refused this update: %s", reason)
            else:
                log.debug("update rejected: %s", reason)
            st.last_refusal = reason
        if answer.stop:
            return "server asked to stop"
        if answer.rebase:
            # The server does not keep our base (it restarted): start again from its model, as a new base.
            log.warning("%s", answer.reason)
            session.pull(trainer, st, force=True, base=True)
            self.baseline, self.baseline_version = session.base, session.version
            return None
        if session.outbox is not None and session.load_model_reply(trainer, reply, answer, pushed, local=local):
            st.pulls += 1  # answered by the push's reply, as the server counts it
        else:
            session.pull(trainer, st, force=False, pushed=pushed)
        return None


class AllReduce:
    """Topology ``collective``: the all-reduce as the trainer's gradient hook, generation after generation."""

    def __init__(self, host: TopologyHost, job: Job, session: Session, rendezvous: Rendezvous,
                 control: ControlClient) -> None:
        self.host, self.job, self.session, self.control = host, job, session, control
        self.first = rendezvous
        self.rank = self.first.rank
        config = job.config
        rule = config.policy("aggregation")
        assert issubclass(rule, AggregationRule)
        self.weighting = rule.gradient_weighting
        # One hook for the session's generations: the rank's compute power (EDP-SGD's
        # weight) and its wish to stop outlive a broken group.
        self.hook: GradientAllReduce | None = None
        self.grad_hook: GradHook | None = None
        self.copied = torch.zeros(0)
        self.last_copy = 0.0

    def train(self) -> str:
        """The generations of this session; returns why they stopped."""
        rv = self.first
        stillborn = 0
        while True:
            group: CollectiveGroup | None = None
            started = False
            try:
                group = self.session.group = CollectiveGroup(rv, self.job.trainer.device)
                self._start_generation(group, rv)
                started = True
                return run_cycles(self.host, self.job, self.session, self)
            except CollectiveError as exc:
                if not self.job.config.collective.regroup:
                    raise
                # A group that cannot even broadcast its first model will not do better next
                # generation (two nccl ranks on one GPU: 1,800 generations in 60 s on an H100).
                stillborn = 0 if started else stillborn + 1
                if stillborn >= STILLBORN_GENERATIONS:
                    raise CollectiveError(f"{stillborn} generations in a row broke before their first step; "
                                          f"the last: {exc}") from None
                failure = exc
            finally:
                if group is not None:
                    self.host.stats.collective_bytes += group.reduced_bytes
                    self.session.group = None
                    group.close()
            nxt, over = self._regroup(rv, failure)
            if nxt is None:
                return over
            rv = nxt

    def _start_generation(self, group: CollectiveGroup, rv: Rendezvous) -> None:
        trainer = self.job.trainer
        # Survivors may differ by a step (an all-reduce that completed on some
        # ranks only): rank 0's weights and fresh optimizer state on every rank
        # make the replicas identical again.
        trainer.optimizer.state.clear()
        group.broadcast_model(trainer.model)
        # The server folds rank 0's copies as deltas: the base is the model it holds now,
        # which an earlier rank 0 of an earlier generation may have sent.
        self.rank = rv.rank
        self.copied = self._server_model() if rv.rank == 0 else trainer.flat()
        self.last_copy = time.monotonic()
        if self.hook is None:
            # compression.push fp16 / bf16: the gradients all-reduced in half precision (the config refuses
            # the codecs an all-reduce cannot sum).
            half = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(self.job.config.compression.push, torch.float32)
            self.hook = GradientAllReduce(group, self.weighting, dtype=half)
        else:
            self.hook.group = group
        self.grad_hook = self.hook

    def _regroup(self, rv: Rendezvous, failure: CollectiveError) -> tuple[Rendezvous | None, str]:
        """The next generation's rendezvous from the server; None and why when the run is over meanwhile."""
        session = self.session
        log.warning("collective generation %d broke (%s); asking the server for the next one", rv.generation, failure)
        try:
            # The server may wait for a slow survivor up to the group timeout past its window.
            nxt = self.control.regroup(session.worker_id, session.token, rv.generation,
                                       wait_seconds=self.job.config.collective.regroup_seconds + rv.timeout_seconds)
        except RemoteError as exc:
            if exc.code == "http_410":
                return None, f"the server's run is over ({exc.message})"
            raise CollectiveError(f"generation {rv.generation} broke ({failure}) and the server refused a "
                                  f"regroup: {exc.message}") from None
        except ServerUnreachable as exc:
            raise CollectiveError(f"generation {rv.generation} broke ({failure}) and the server cannot be "
                                  f"asked for the next one: {exc}") from None
        log.warning("joining collective generation %d as rank %d of %d", nxt.generation, nxt.rank, nxt.world_size)
        return nxt, ""

    def _active(self) -> GradientAllReduce:
        assert self.hook is not None, "a generation starts before its first cycle"
        return self.hook

    def start_cycle(self) -> Stop:
        # An operator's stop is said in the next all-reduce, so nobody is left waiting.
        hook = self._active()
        hook.stop = hook.stop or self.host.stop_requested.is_set()
        return None

    def steps(self, work: Work, samples: int) -> int | None:
        # Every rank takes part in the same number of all-reduces, whatever samples arrived.
        return max(1, (work.cycle_samples or samples) // (work.batch_size * work.accumulation))

    def stop_signal(self, signal: StopSignal) -> str:
        if signal.error is not None and not isinstance(signal.error, StopRequested):
            raise signal.error
        # Tell the others in the all-reduce they are waiting in: nobody hangs.
        self._active().group.reduce_gradients(list(self.job.trainer.model.parameters()), 0.0, True)
        return signal.reason

    def finish_cycle(self, work: Work, result: CycleResult) -> Stop:
        host, hook = self.host, self._active()
        if result.compute_seconds > 0 and result.samples:
            hook.power = result.samples / result.compute_seconds  # DP-SGD Eq. 2, for EDP-SGD's weights
        cycle = cycle_record(work, result, pushed=False)
        due = time.monotonic() - self.last_copy >= self.job.config.eval_interval_seconds
        if self.rank == 0 and (result.stopped or due):
            self.copied, self.last_copy = self._send_copy(self.copied), time.monotonic()
        if host.report(self.job, self.session, cycle=cycle):
            hook.stop = True  # said in the next all-reduce
        if result.stopped:
            # An operator's stop keeps the reason it was given.
            return "" if host.stop_requested.is_set() else "the collective group agreed to stop"
        return None

    def _server_model(self) -> torch.Tensor:
        """The server's current model, without loading it (the group's replica is the one to train)."""
        session = self.session
        reply = session.data.request(MsgType.PULL_MODEL, request_body(PullModel(if_newer=False, dtype="float32")),
                                     model_version=session.version)
        if reply.payload is None:
            return self.job.trainer.flat()
        session.version = reply.header.model_version
        return reply.payload.flat().clone()

    def _send_copy(self, base: torch.Tensor) -> torch.Tensor:
        """Rank 0: the change since the last copy, folded by the server with weight 1 (it then holds our model)."""
        session, st = self.session, self.host.stats
        flat = self.job.trainer.flat()
        reply = session.data.request(
            MsgType.PUSH_UPDATE, request_body(PushUpdate(samples=1, copy=True)),
            payload=(flat - base).to(self.job.wire_dtype),
            model_version=session.version, shapes=self.job.spec.shapes, idempotent=False,
        )
        answer = parse_reply(PushReply, reply.header.body, "PUSH_REPLY")
        if answer.status == "applied":
            session.version = reply.header.model_version
            st.pushes += 1
            st.applied += 1
            return flat
        log.warning("model copy not applied: %s", answer.reason)
        return base
