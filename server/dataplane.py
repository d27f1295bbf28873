"""ZeroMQ data plane: an asyncio ROUTER socket in front of the engine.

Each request is handled on the loop turn that received it, and goes on in a
task of its own when it has to wait, so a worker held at a barrier never
blocks the others. Every failure becomes an error reply, a counter and a log
line; the loop itself only stops when told to.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
from collections.abc import Coroutine, Generator
from typing import Any, cast

import msgpack
import zmq

from hermes.common.wire import MAX_HEADER_BYTES, ErrorCode, Header, ProtocolError, error_frames
from hermes.server.aio import cancel_and_wait
from hermes.server.auth import RateLimiter
from hermes.server.engine import Engine
from hermes.server.heap import HeapTrimmer

log = logging.getLogger(__name__)

# Plain ints: pyzmq's flag enums build an enum object per operation (issue 31: the loop's CPU a request).
_NOBLOCK = int(zmq.NOBLOCK)
_SNDMORE_NOBLOCK = int(zmq.SNDMORE) | _NOBLOCK
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)


class DataPlane:
    """The ROUTER loop: admits a request cheaply, then hands it to the engine (a task of its own if it waits).

    Admission, before any task or tensor work: the header must decode and
    name a registered worker (garbage and strangers are counted, answered
    only while the error-reply budget lasts, and otherwise dropped); a peer
    may have ``max_per_peer`` requests in flight and all peers together
    ``max_inflight_bytes`` of message bytes (refused ``unavailable``, retried
    by agents). The loop yields after every message, so a flood on the data
    port cannot starve the control plane that shares the event loop.
    """

    def __init__(self, engine: Engine, host: str, port: int, *, max_in_flight: int = 1024,
                 max_per_peer: int = 16, max_inflight_bytes: int | None = None,
                 error_replies_per_second: float = 500.0, error_reply_burst: int = 1000,
                 trim_quiet_s: float = 0.5) -> None:
        self.engine = engine
        self.host = host
        self.requested_port = port
        self.port: int | None = None
        self.max_in_flight = max_in_flight
        self.max_per_peer = max_per_peer
        # Four largest messages at once by default: what a handful of honest pushes of the
        # biggest model need, and a bound on what many peers together can make the server hold.
        self.max_inflight_bytes = max_inflight_bytes or 4 * engine.max_message_bytes
        # One bucket for all peers: a flood from many connections shares it.
        self._error_budget = RateLimiter(error_replies_per_second, error_reply_burst, clock=engine.clock)
        # Freed frame buffers go back to the OS once a flood of refusals is over (server/heap.py).
        self._trimmer = HeapTrimmer(trim_quiet_s)
        self._ctx: zmq.Context | None = None
        self._sock: zmq.Socket | None = None
        # Set by the loop's reader on the socket's FD; cleared when a receive finds nothing (_serve).
        self._readable = asyncio.Event()
        # True while the receive loop's own turn sends (_start, its error replies): see _send.
        self._at_once = False
        self._fd: int | None = None
        self._task: asyncio.Task | None = None
        self._inflight: set[asyncio.Task] = set()
        self._per_peer: dict[bytes, int] = {}
        self.inflight_bytes = 0

    async def start(self) -> int:
        # A plain socket read and written without blocking from the loop's thread, woken by the loop's
        # reader on its FD: zmq.asyncio's future per receive and send, its poller and its flag enums
        # (about 50 Python calls a request) cost ~0.1 ms of the loop's CPU a request (issue 31).
        self._ctx = zmq.Context()
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, socket_frame_cap(self.engine.max_message_bytes))
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        # One complete message queued per connection (libzmq then stops reading that peer: TCP
        # backpressure). Its default, 1000, let complete frames pile up unread while the loop was
        # busy: a 64-peer burst of 4 MiB frames peaked at +381 MiB against the 316 MiB the bound
        # allows (2026-11-26); with 1 it stays under. Agents have one request in flight per socket.
        sock.setsockopt(zmq.RCVHWM, 1)
        if self.requested_port:
            sock.bind(f"tcp://{self.host}:{self.requested_port}")
            self.port = self.requested_port
        else:
            self.port = sock.bind_to_random_port(f"tcp://{self.host}")
        self._sock = sock
        self._fd = cast(int, sock.getsockopt(zmq.FD))
        asyncio.get_running_loop().add_reader(self._fd, self._on_fd)
        self._task = asyncio.create_task(self._serve(), name="hermes-dataplane")
        log.info("data plane listening on tcp://%s:%d", self.host, self.port)
        return self.port

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        # Give held replies (released by request_stop) a moment to go out.
        if self._inflight:
            await asyncio.wait(list(self._inflight), timeout=2.0)
        for t in list(self._inflight):
            t.cancel()
        await self._trimmer.close()
        if self._fd is not None:
            asyncio.get_running_loop().remove_reader(self._fd)
            self._fd = None
        if self._sock is not None:
            self._sock.close(linger=0)
        if self._ctx is not None:
            self._ctx.term()
        log.info("data plane stopped")

    def _on_fd(self) -> None:
        """The loop's reader on libzmq's FD (level-triggered): reading EVENTS processes libzmq's pending
        commands, which clears the FD, so the reader does not fire again until something changes; the receive
        loop is woken only when a message is there."""
        sock = self._sock
        if sock is not None and not sock.closed and cast(int, sock.get(_EVENTS)) & _POLLIN:
            self._readable.set()

    async def _serve(self) -> None:
        assert self._sock is not None
        while True:
            try:
                frames = _recv_message(self._sock)
            except zmq.Again:
                # The FD only signals a change (edge-like): wait for the next one unless a message came in
                # meanwhile (reading EVENTS re-arms the FD).
                self._readable.clear()
                if not cast(int, self._sock.get(_EVENTS)) & _POLLIN:
                    await self._readable.wait()
                continue
            except zmq.ZMQError as exc:
                log.warning("data plane receive failed: %s", exc)
                await asyncio.sleep(0)
                continue
            identity = frames[0].bytes
            size = sum(len(f.buffer) for f in frames[1:])
            admitted = self._admit(identity, frames[1:], size)
            if isinstance(admitted, Header):
                self._per_peer[identity] = self._per_peer.get(identity, 0) + 1
                self.inflight_bytes += size
                self._start(identity, frames[1:], admitted, size)
            else:
                code, message = admitted
                self._trimmer.note_refused(size)
                self.engine.metrics.errors.labels(code=code.value).inc()
                if self._error_budget.allow("error replies") == 0.0:
                    self._at_once = True
                    try:
                        await self._send(identity, error_frames(code, message, seq=_seq_of(frames[1:])))
                    finally:
                        self._at_once = False
                else:
                    self.engine.metrics.limit_hits.labels(limit="error_replies").inc()
            # A ready recv completes without yielding: give the control plane its turn before the next
            # message; with none queued, wait for one (reading EVENTS re-arms the FD, as after zmq.Again).
            self._readable.clear()
            if cast(int, self._sock.get(_EVENTS)) & _POLLIN:
                await asyncio.sleep(0)
            else:
                await self._readable.wait()

    def _start(self, identity: bytes, frames: list, header: Header, size: int) -> None:
        """Handle an admitted request at once, on the loop turn that received it, as Python 3.12's eager tasks
        do: most requests finish without waiting, and a task of their own (its scheduling, its step, its done
        callback) took two of a top-k push's four loop turns (issue 31; docs/compression.md, micro8). A
        request that has to wait (a barrier, the step lock, a worker thread) goes on in a task of its own from
        where it waits. In a copy of the context, as a task's: the handler sets the request's context variable."""
        coro = self._handle(identity, frames, header, size)
        context = contextvars.copy_context()
        self._at_once = True
        try:
            waiting = context.run(coro.send, None)
        except StopIteration:
            self._release(identity, size)
            return
        except asyncio.CancelledError:
            # A handler that met a cancelled future ends as its task would have: cancelled, without a reply.
            self._release(identity, size)
            log.info("request from %s cancelled", identity.hex())
            return
        except Exception:
            # _handle answers every failure itself: this is a bug, logged as a task's would be; the loop goes on.
            self._release(identity, size)
            log.exception("request from %s failed outside its handler", identity.hex())
            return
        finally:
            self._at_once = False
        task = asyncio.get_running_loop().create_task(_Resumed(coro, waiting), context=context)
        self._inflight.add(task)
        task.add_done_callback(functools.partial(self._done, identity=identity, size=size))

    def _admit(self, identity: bytes, frames: list, size: int) -> Header | tuple[ErrorCode, str]:
        """The request's header to handle it, or the (code, message) it is refused with: cheap checks
        only. The header is unpacked once, here, and handed on to the engine."""
        if not frames:
            return ErrorCode.MALFORMED, "empty message"
        try:
            header = Header.unpack(frames[0].buffer)
        except ProtocolError as exc:
            return exc.code, exc.message
        if self.engine.registry.get(header.worker) is None:
            return ErrorCode.UNKNOWN_WORKER, f"unknown worker id {header.worker!r}"
        if len(self._inflight) >= self.max_in_flight:
            return ErrorCode.UNAVAILABLE, "server busy, retry later"
        if self._per_peer.get(identity, 0) >= self.max_per_peer:
            self.engine.metrics.limit_hits.labels(limit="peer_in_flight").inc()
            return ErrorCode.UNAVAILABLE, f"more than {self.max_per_peer} requests in flight from this connection"
        if self.inflight_bytes + size > self.max_inflight_bytes and self.inflight_bytes > 0:
            self.engine.metrics.limit_hits.labels(limit="inflight_bytes").inc()
            log.warning("in-flight memory budget hit: %d + %d bytes > %d; asking the peer to retry",
                        self.inflight_bytes, size, self.max_inflight_bytes)
            return ErrorCode.UNAVAILABLE, "server memory budget for in-flight messages reached, retry later"
        return header

    def _done(self, task: asyncio.Task, *, identity: bytes, size: int) -> None:
        self._inflight.discard(task)
        self._release(identity, size)

    def _release(self, identity: bytes, size: int) -> None:
        """A request is over: its bytes and its place in its peer's count are free."""
        self.inflight_bytes -= size
        left = self._per_peer.get(identity, 1) - 1
        if left:
            self._per_peer[identity] = left
        else:
            self._per_peer.pop(identity, None)

    async def _handle(self, identity: bytes, frames: list, header: Header | None = None, size: int = 0) -> None:
        try:
            reply = await self.engine.handle(frames, header, size)
        except ProtocolError as exc:
            self._trimmer.note_refused(size)
            self.engine.metrics.errors.labels(code=exc.code.value).inc()
            if exc.code is ErrorCode.TOO_LARGE:
                self.engine.metrics.limit_hits.labels(limit="max_message_bytes").inc()
            log.warning("rejected message from %s: %s", identity.hex(), exc)
            reply = error_frames(exc.code, exc.message, seq=_seq_of(frames))
        except asyncio.CancelledError:
            raise
        except Exception:
            self.engine.metrics.errors.labels(code=ErrorCode.INTERNAL.value).inc()
            log.exception("internal error handling a message from %s", identity.hex())
            reply = error_frames(ErrorCode.INTERNAL, "internal server error", seq=_seq_of(frames))
        await self._send(identity, reply)

    async def _send(self, identity: bytes, reply: list) -> None:
        sock = self._sock
        if sock is None:
            return
        wait = 0.001
        while True:
            try:
                _send_message(sock, identity, reply)
                break
            except zmq.Again:
                # The peer's queue is full (its high-water mark): wait for it as a blocking send would.
                await asyncio.sleep(wait)
                wait = min(2 * wait, 0.05)
                if sock.closed:
                    return
            except zmq.ZMQError as exc:
                # The peer went away (ROUTER_MANDATORY): its event, not our crash.
                log.info("could not reply to %s: %s", identity.hex(), exc)
                break
        # A send processes the socket's pending commands, which can consume the FD's signal of a message
        # that came in: wake the receive loop if one is waiting. Not needed for a send of the receive loop's
        # own turn (its error replies, a request answered at once): it reads EVENTS itself next.
        if not self._at_once:
            self._on_fd()


class _Resumed(Coroutine[Any, Any, None]):
    """The rest of a coroutine whose first step already ran and yielded ``waiting``: what ``yield from`` would
    be from there on, so a task can take it over (``DataPlane._start``). Its first ``send`` hands the task what
    the coroutine waits on; then every ``send`` and ``throw`` (a cancel) goes to the coroutine."""

    def __init__(self, coro: Coroutine[Any, Any, None], waiting: Any) -> None:
        self._coro = coro
        self._waiting: Any = waiting
        self._first = True

    def send(self, value: Any) -> Any:
        if self._first:
            self._first = False
            waiting, self._waiting = self._waiting, None
            return waiting
        return self._coro.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        # Thrown before the task's first step (a cancel): into the coroutine, where it waits.
        self._first, self._waiting = False, None
        if val is None and tb is None:
            return self._coro.throw(typ)
        return self._coro.throw(typ, val, tb)

    def close(self) -> None:
        self._coro.close()

    def __await__(self) -> Generator[Any, Any, None]:
        # A task drives it by send and throw; awaited, it is driven the same way.
        try:
            waiting = self.send(None)
            while True:
                try:
                    value = yield waiting
                except BaseException as exc:  # noqa: BLE001 - everything thrown in goes to the coroutine
                    waiting = self.throw(exc)
                else:
                    waiting = self.send(value)
        except StopIteration:
            return


def _recv_message(sock: zmq.Socket) -> list[zmq.Frame]:
    """One whole multipart message without blocking (``zmq.Again`` when none is queued). Its frames' own
    ``more`` flag ends it, not a RCVMORE getsockopt a frame as ``recv_multipart``'s; the parts of a message
    arrive together, so none after the first can be missing."""
    frame = sock.recv(_NOBLOCK, copy=False)
    frames = [frame]
    while frame.more:
        frame = sock.recv(_NOBLOCK, copy=False)
        frames.append(frame)
    return frames


def _send_message(sock: zmq.Socket, identity: bytes, reply: list) -> None:
    """``send_multipart([identity, *reply], NOBLOCK, copy=False)`` without its per-frame type check and flag
    enums (the reply's frames are bytes, memoryviews or zmq.Frames, ours). Atomic as that is: a ROUTER
    queues a message's parts only when the last one is sent, and ``zmq.Again`` is raised by the first."""
    last = len(reply) - 1
    sock.send(identity, _SNDMORE_NOBLOCK if reply else _NOBLOCK, copy=False)
    for i, part in enumerate(reply):
        sock.send(part, _NOBLOCK if i == last else _SNDMORE_NOBLOCK, copy=False)


def socket_frame_cap(max_message_bytes: int) -> int:
    """The largest single frame libzmq accepts: twice the message limit.

    A frame up to this size is received, refused in protocol with ``too_large``
    (naming the limit) and counted. A bigger one makes libzmq drop the peer's
    connection before allocating it: the one defence against a frame sized to
    exhaust memory, and no reply can reach a dropped connection. Agents learn
    the limit at registration and never send such a frame.
    """
    return 2 * max_message_bytes + MAX_HEADER_BYTES


def _seq_of(frames: list) -> int:
    """Best-effort seq of a rejected request, so the client can match the error."""
    try:
        raw = frames[0].buffer if hasattr(frames[0], "buffer") else frames[0]
        if len(raw) > MAX_HEADER_BYTES:
            return 0
        seq = msgpack.unpackb(raw, raw=False).get("seq", 0)
        return seq if isinstance(seq, int) and not isinstance(seq, bool) else 0
    except Exception:
        return 0
