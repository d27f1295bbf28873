"""Collective topology on the agent: workers all-reduce weighted gradients among themselves.

The server only coordinates (rank, world size, the rendezvous store, work
sizes); the model lives on the workers, replicated, and every step all
workers apply the same reduced gradient, so the replicas stay identical.
torch.distributed does the all-reduce (gloo on CPU, nccl on CUDA): never a
home-made one.

Weighting. Each rank contributes ``weight * mean_gradient`` and ``weight``
in one flat buffer; after a SUM all-reduce the gradient is divided by the
summed weight. With weight = the step's sample count this is exactly the
mean gradient over the union of the workers' batches, whatever their sizes
(OmniLearn Eq. 4b lambda_k = b_k / sum(b); Chao et al.: accumulation-weighted)
and however many samples a short last step holds: nothing is silently divided
by the world size. ``mean`` weighs every rank 1 (plain averaging, DP-SGD) and
``power`` by its compute power (EDP-SGD Sec. 4.2).

The same buffer carries a stop flag: a worker that must stop says so in its
last all-reduce and every rank stops after the same step, so nobody is left
waiting in a collective that will never complete. A rank that dies makes the
others' all-reduce fail within the group timeout (a clear error, no hang);
the agent then destroys the group and, unless regrouping is off, asks the
server for the next generation (``Rendezvous.generation``), whose ranks
rendezvous under their own store prefix and start from rank 0's replica.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, Protocol, TypeAlias, cast

import torch
import torch.distributed as dist
from pydantic import ValidationError
from torch import nn

from hermes.common.control_messages import CollectiveRendezvous
from hermes.common.messages import describe

log = logging.getLogger(__name__)



def _set_grads(params: Sequence[nn.Parameter], flat: torch.Tensor) -> None:
    """Each parameter's gradient from its slice of the all-reduced buffer (in the gradient's own dtype)."""
    offset = 0
    for p in params:
        n = p.numel()
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
        offset += n

class CollectiveError(RuntimeError):
    """A peer failed or the group could not form: the run cannot go on with this group."""


# The one schema of a rendezvous, shared with the server (common/messages.py).
Rendezvous: TypeAlias = CollectiveRendezvous


def rendezvous_from_reply(body: Any) -> Rendezvous:
    """The rendezvous a register or regroup reply carries; CollectiveError naming the bad field otherwise."""
    try:
        return CollectiveRendezvous.model_validate(body)
    except ValidationError as exc:
        raise CollectiveError(f"server sent an unusable rendezvous: {describe(exc)}") from None


class GradientAllReduce:
    """The trainer's gradient hook for topology collective: each step's gradients become the
    weighted mean over all ranks before the optimizer step (see the module docstring).

    ``weighting``: "samples" (union-of-batches gradient), "mean" (1 per rank
    with samples) or "power" (``power``, the rank's compute power, EDP-SGD).
    ``stop`` is this rank's wish to stop, said in every all-reduce it joins.
    """

    def __init__(self, group: CollectiveGroup, weighting: str = "samples", power: float = 1.0,
                 dtype: torch.dtype = torch.float32) -> None:
        if weighting not in ("samples", "mean", "power"):
            raise ValueError(f"unknown gradient weighting {weighting!r}: samples, mean or power")
        self.group = group
        self.weighting = weighting
        self.power = power
        self.stop = False
        # compression.push fp16 / bf16: the gradients travel in this dtype (DDP's fp16_compress_hook).
        self.dtype = dtype

    def __call__(self, params: Sequence[nn.Parameter], samples: int) -> bool:
        if samples == 0:
            weight = 0.0  # a rank with no samples this step still joins the all-reduce
        else:
            weight = {"samples": float(samples), "mean": 1.0, "power": self.power}[self.weighting]
        _, stop = self.group.reduce_gradients(params, weight, self.stop, dtype=self.dtype)
        return stop


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


# Gloo groups left behind with a collective still pending (see CollectiveGroup.close), each
# with that collective's completion event: destroying such a group would wait for the
# collective's timeout, and one destroyed at interpreter exit while it fails aborts the process.
_abandoned: list[tuple[object, threading.Event]] = []


def settle_abandoned(max_seconds: float) -> None:
    """Before the process exits: let abandoned collectives end (by error or by the group
    timeout, at most ``max_seconds`` from now), then let their groups go."""
    deadline = time.monotonic() + max_seconds
    while _abandoned:
        pg, done = _abandoned.pop()
        if not done.wait(max(0.0, deadline - time.monotonic())):
            log.warning("an abandoned collective is still pending at exit")
            _abandoned.append((pg, done))  # never destroyed: the process ends around it
            return
        del pg


class _Collectives(Protocol):
    """What we use of a process group (gloo's own group, or torch's default one for nccl)."""

    def broadcast(self, tensors: list[torch.Tensor], opts: dist.BroadcastOptions) -> dist.Work: ...

    def allreduce(self, tensors: list[torch.Tensor], opts: dist.AllreduceOptions) -> dist.Work: ...

    def shutdown(self) -> None: ...


class CollectiveGroup:
    """One generation of the process group, formed on the server's store (MASTER_ADDR:MASTER_PORT).

    With gloo the group is this object's own ProcessGroupGloo, not torch's
    default group: gloo cannot abort a collective, and destroying a group
    waits until a pending one times out, so a group the server says is
    broken (``abort``) is simply left behind and the next generation built
    beside it. nccl uses the default group (destroyed as usual).
    """

    def __init__(self, rv: Rendezvous, device: torch.device) -> None:
        self.rv = rv
        self.device = device
        self.backend = backend_for(device)
        self._lock = threading.Lock()
        self._aborted: str | None = None
        self._waiting: threading.Event | None = None
        self._pending = False  # a collective was abandoned while still running
        self._pending_done: threading.Event | None = None
        self.pg: _Collectives | None = None
        timeout = timedelta(seconds=rv.timeout_seconds)
        try:
            store: dist.Store = dist.TCPStore(rv.master_addr, rv.master_port, rv.world_size, is_master=False,
                                              timeout=timeout)
            if rv.store_prefix:
                store = dist.PrefixStore(rv.store_prefix, store)
            if self.backend == "gloo":
                # torch's stubs leave out the backend's collectives, which it has at run time.
                self.pg = cast(_Collectives, dist.ProcessGroupGloo(store, rv.rank, rv.world_size, timeout))
            else:
                dist.init_process_group(self.backend, store=store, rank=rv.rank, world_size=rv.world_size,
                                        timeout=timeout)
                self.pg = cast(_Collectives, dist.group.WORLD)
        except (RuntimeError, ValueError) as exc:
            raise CollectiveError(f"could not join the process group at {rv.master_addr}:{rv.master_port} "
                                  f"as rank {rv.rank}/{rv.world_size}: {exc}") from None
        self.reduced_bytes = 0
        self.allreduces = 0
        log.info("joined the process group: rank %d of %d (%s, generation %d) at %s:%d", rv.rank,
                 rv.world_size, self.backend, rv.generation, rv.master_addr, rv.master_port)

    def broadcast_model(self, model: nn.Module) -> None:
        """Replicas start from rank 0's weights."""
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).to(self.device)
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        # The lambda reads the group when called: a failure's traceback must not keep an
        # abandoned gloo group alive past settle_abandoned (destroyed at exit, it aborts the process).
        self._run("broadcast", lambda: self._group().broadcast([flat], opts))
        offset = 0
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()

    def reduce_gradients(self, params: Sequence[nn.Parameter], weight: float, stop: bool,
                         dtype: torch.dtype = torch.float32) -> tuple[float, bool]:
        """Replace each parameter's gradient by the weighted mean over all ranks.

        Returns (the summed weight, whether any rank asked to stop). A rank
        with no samples this step passes weight 0 and zero gradients.
        ``dtype`` fp16 / bf16 (compression.push): see ``_reduce_half``.
        """
        grads = [p.grad.reshape(-1) if p.grad is not None else torch.zeros(p.numel(), device=self.device)
                 for p in params]
        if dtype != torch.float32:
            return self._reduce_half(params, grads, weight, stop, dtype)
        flat = torch.cat([g.float() * weight for g in grads]
                         + [torch.tensor([float(weight), 1.0 if stop else 0.0], device=self.device)])
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp(dist.ReduceOp.SUM)
        self._run("all_reduce", lambda: self._group().allreduce([flat], opts))
        total, stops = float(flat[-2]), float(flat[-1])
        if total > 0:
            flat[:-2] /= total
        _set_grads(params, flat)
        self.allreduces += 1
        # Ring all-reduce moves 2 (W-1)/W of the buffer through each rank.
        w = self.rv.world_size
        self.reduced_bytes += int(2 * (w - 1) / w * flat.numel() * flat.element_size())
        return total, stops > 0

    def _reduce_half(self, params: Sequence[nn.Parameter], grads: list[torch.Tensor], weight: float, stop: bool,
                     dtype: torch.dtype) -> tuple[float, bool]:
        """The weighted mean with the gradients in half precision, as DDP's fp16_compress_hook sends them: first
        the weights and stop flags (2 fp32 values), so each rank scales its gradient by weight / total before the
        half-precision sum, which is then the mean itself (a weighted sum in fp16 could overflow; fp16 and bf16
        count samples exactly only to 2,048 and 256). One more all-reduce of 8 bytes, for half the bytes."""
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp(dist.ReduceOp.SUM)
        control = torch.tensor([float(weight), 1.0 if stop else 0.0], device=self.device)
        self._run("all_reduce", lambda: self._group().allreduce([control], opts))
        total, stops = float(control[0]), float(control[1])
        scale = weight / total if total > 0 else 0.0
        flat = torch.cat([g.float() * scale for g in grads]).to(dtype)
        self._run("all_reduce", lambda: self._group().allreduce([flat], opts))
        _set_grads(params, flat)
        self.allreduces += 1
        w = self.rv.world_size
        self.reduced_bytes += int(2 * (w - 1) / w * (flat.numel() * flat.element_size() + control.numel() * 4))
        return total, stops > 0

    def _group(self) -> _Collectives:
        if self.pg is None:
            raise CollectiveError(f"generation {self.rv.generation}'s group is closed")
        return self.pg

    def abort(self, reason: str) -> None:
        """From another thread: the server says this generation broke; stop waiting in (or for) a collective."""
        with self._lock:
            self._aborted = reason
            if self._waiting is not None:
                self._waiting.set()

    def _run(self, name: str, start: Callable[[], dist.Work]) -> None:
        done = threading.Event()
        with self._lock:
            if self._aborted is not None:
                raise CollectiveError(f"{name} not started: {self._aborted}")
            self._waiting = done
        error: str | None = None
        try:
            work = start()
            work.get_future().add_done_callback(lambda _f: done.set())
            # No timeout here: the group timeout ends a collective with a dead peer, abort() one
            # the server already knows is broken (gloo may not notice a peer died until the timeout).
            done.wait()
            with self._lock:
                # The future may complete a moment before the work says so: only an abort abandons it.
                self._pending = self._aborted is not None and not work.is_completed()
            if self._pending:
                self._pending_done = done
            else:
                work.wait()  # raises the backend's error, if it failed
        except (RuntimeError, dist.DistBackendError) as exc:
            error = str(exc)
        finally:
            with self._lock:
                self._waiting = None
        if self._pending:
            raise CollectiveError(f"{name} abandoned (a peer died or timed out): {self._aborted}")
        if error is not None:
            raise CollectiveError(f"{name} failed (a peer died or timed out after "
                                  f"{self.rv.timeout_seconds:g}s): {error}")

    def close(self) -> None:
        if self.backend == "gloo":
            if self._pending and self._pending_done is not None:
                # Shutting it down would wait for the pending collective's timeout.
                _abandoned.append((self.pg, self._pending_done))
            elif self.pg is not None:
                try:
                    # Gracefully, as destroy_process_group does: a peer may still be reading our last messages.
                    self.pg.shutdown()
                except (RuntimeError, dist.DistBackendError) as exc:
                    log.info("shutting down the process group: %s", exc)
            self.pg = None
            return
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except (RuntimeError, dist.DistBackendError) as exc:
                # A broken group may fail to tear down cleanly; the next one is built from scratch.
                log.info("destroying the process group: %s", exc)
