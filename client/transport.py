"""The agent's two links to the server: HTTP control plane and ZeroMQ data plane.

Standard library HTTP (urllib) keeps the agent light: no fastapi, uvicorn or
HTTP client package on the device. A DataClient is one DEALER socket and is
used by one thread only (ZeroMQ sockets are not thread-safe); the prefetcher
has its own.

Every data-plane request is signed with the worker's secret (Poly1305 MAC, see
hermes.common.signing) under a random session id, a growing seq and a
server-clock timestamp; replies must carry the server's signature under the
same secret and echo the session and seq.
"""

from __future__ import annotations

import json
import logging
import ssl
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

import torch
import zmq
from pydantic import ValidationError

from hermes.client.preflight import tls_context
from hermes.common.config import RunConfig
from hermes.common.control_messages import (
    CollectiveRendezvous,
    HeartbeatReply,
    HTTPErrorBody,
    RegisterRequest,
    RegisterResponse,
    RegroupRequest,
)
from hermes.common.messages import ErrorReply, parse_reply, request_body
from hermes.common.signing import ServerClock, new_session
from hermes.common.wire import (
    DEFAULT_MAX_MESSAGE_BYTES,
    ErrorCode,
    Header,
    Message,
    MsgType,
    ProtocolError,
    decode,
    encode,
    verify_mac,
)

log = logging.getLogger(__name__)

__all__ = ["ControlClient", "DataClient", "RemoteError", "RequestCancelled", "RunOver", "ServerUnreachable",
           "StopRequested", "TrafficCounter", "tls_context"]


def _detail(body: str) -> str:
    """FastAPI's {"detail": "..."} as its text; any other body as it is."""
    try:
        return HTTPErrorBody.model_validate_json(body).detail
    except ValidationError:
        return body


class ServerUnreachable(Exception):
    """The server did not answer within the retry budget."""


class RemoteError(Exception):
    """The server answered with an error reply."""

    def __init__(self, code: str, message: str, retry_after: float | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        # The server's Retry-After, where it sent one (e.g. a name held by a silent agent).
        self.retry_after = retry_after


class StopRequested(Exception):
    """The agent was told to stop (SIGTERM, Ctrl-C) while it waited for the server."""


class RunOver(StopRequested):
    """The server refused a registration because its run has ended (target reached, stopped)."""


class RequestCancelled(Exception):
    """A data-plane wait was cut short by the agent (stopping, or its registration is gone)."""


def _seconds(text: str | None) -> float | None:
    try:
        return float(text) if text else None
    except ValueError:
        return None


class ControlClient:
    def __init__(
        self, base_url: str, *, timeout: float = 10.0, retries: int = 8, backoff: float = 0.5,
        stop: threading.Event | None = None, join_token: str | None = None, ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.join_token = join_token
        self.ssl_context = ssl_context
        # Backoff waits on this, so a stop request ends the retries at once.
        self.stop = stop or threading.Event()

    def _call(self, method: str, path: str, body: dict | None = None, headers: dict | None = None,
              timeout: float | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.base_url + path, data=data, method=method,
            headers={"Content-Type": "application/json", **(headers or {})},
        )
        delay, last = self.backoff, None
        for attempt in range(self.retries + 1):
            try:
                with urllib.request.urlopen(req, timeout=timeout or self.timeout, context=self.ssl_context) as resp:
                    return json.loads(resp.read() or b"null")
            except urllib.error.HTTPError as exc:
                detail = _detail(exc.read().decode(errors="replace")[:2000])[:500]
                if exc.code in (429, 502, 503, 504) and attempt < self.retries:
                    last = f"HTTP {exc.code}: {detail}"
                    retry_after = exc.headers.get("Retry-After", "")
                    if retry_after.isdigit():
                        delay = max(delay, min(60.0, float(retry_after)))
                else:
                    raise RemoteError(f"http_{exc.code}", detail, _seconds(exc.headers.get("Retry-After"))) from None
            except urllib.error.URLError as exc:
                if isinstance(exc.reason, ssl.SSLError):
                    # A certificate problem does not go away by retrying.
                    raise RemoteError("tls", f"TLS with {self.base_url} failed: {exc.reason}") from None
                last = str(exc.reason)
            except (ConnectionError, TimeoutError, OSError) as exc:
                last = str(exc)
            if attempt < self.retries:
                log.info("server %s not reachable (%s); retry %d/%d in %.1fs",
                         self.base_url, last, attempt + 1, self.retries, delay)
                if self.stop.wait(delay):
                    raise StopRequested(f"stopped while waiting for the server at {self.base_url}")
                delay = min(delay * 2, 10.0)
        raise ServerUnreachable(f"server {self.base_url} unreachable after {self.retries + 1} attempts: {last}")

    def register(self, request: RegisterRequest) -> RegisterResponse:
        headers = {"Authorization": f"Bearer {self.join_token}"} if self.join_token else {}
        reply = self._call("POST", "/v1/workers/register", request_body(request), headers=headers)
        return parse_reply(RegisterResponse, reply, "register")

    def heartbeat(self, worker_id: str, token: str) -> HeartbeatReply:
        reply = self._call("POST", f"/v1/workers/{worker_id}/heartbeat", {}, headers={"X-Hermes-Token": token})
        return parse_reply(HeartbeatReply, reply, "heartbeat")

    def leave(self, worker_id: str, token: str) -> None:
        self._call("POST", f"/v1/workers/{worker_id}/leave", {}, headers={"X-Hermes-Token": token})

    def regroup(self, worker_id: str, token: str, generation: int, wait_seconds: float) -> CollectiveRendezvous:
        """Report that collective ``generation`` failed; the reply (after up to ``wait_seconds``) is the next one."""
        reply = self._call("POST", f"/v1/workers/{worker_id}/regroup", request_body(RegroupRequest(generation=generation)),
                           headers={"X-Hermes-Token": token}, timeout=wait_seconds + self.timeout)
        return parse_reply(CollectiveRendezvous, reply, "regroup")

    def run_config(self) -> RunConfig:
        """The server's run config (GET /v1/config): the agent builds its task from it before registering."""
        headers = {"Authorization": f"Bearer {self.join_token}"} if self.join_token else {}
        return RunConfig(**self._call("GET", "/v1/config", headers=headers))

    def status(self) -> dict[str, Any]:
        # The join token also opens a server's protected read endpoints (protect_reads).
        headers = {"Authorization": f"Bearer {self.join_token}"} if self.join_token else {}
        return self._call("GET", "/v1/status", headers=headers)


@dataclass
class TrafficCounter:
    bytes_sent: int = 0
    bytes_received: int = 0
    # time.monotonic() at which the newest request that got a signed reply was sent: the
    # server has heard from this worker since then (its last_seen), which a heartbeat would say.
    answered_at: float = 0.0


class DataClient:
    """Request/reply over a DEALER socket with timeouts, seq matching and reconnects."""

    def __init__(
        self,
        address: str,
        worker_id: str,
        token: str,
        *,
        timeout: float = 30.0,
        retries: int = 3,
        counter: TrafficCounter | None = None,
        context: zmq.Context | None = None,
        clock: ServerClock | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        cancel: threading.Event | None = None,
    ) -> None:
        self.address = address
        self.worker_id = worker_id
        self.key = token.encode()
        self.session = new_session()
        self.clock = clock or ServerClock()
        self.max_message_bytes = max_message_bytes
        # Set by the agent to cut a wait short (stop, or the server forgot us).
        self.cancel = cancel
        self.timeout = timeout
        self.retries = retries
        self.counter = counter or TrafficCounter()
        self._ctx = context or zmq.Context.instance()
        self._seq = 0
        self._sock: zmq.Socket | None = None
        self._connect()

    def _connect(self) -> None:
        if self._sock is not None:
            self._sock.close(linger=0)
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.copy_threshold = SEND_COPY_BELOW
        sock.connect(self.address)
        self._sock = sock
        self._rcvtimeo = -1  # the socket's receive timeout, set per wait (_await_reply)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None

    def request(
        self,
        type_: MsgType,
        body: dict[str, Any] | None = None,
        *,
        payload: torch.Tensor | None = None,
        model_version: int = 0,
        shapes: tuple = (),
        timeout: float | None = None,
        idempotent: bool = True,
    ) -> Message:
        """Send one request and wait for its reply. Error replies raise RemoteError.

        Only idempotent requests are retried after a timeout: a push that timed
        out may have been applied, so it is never sent twice.
        """
        attempts = self.retries + 1 if idempotent else 1
        wait = self.timeout if timeout is None else timeout
        for attempt in range(attempts):
            self._seq += 1
            header = Header.make(
                type=type_, worker=self.worker_id, session=self.session, seq=self._seq, ts=self.clock.now_ms(),
                model_version=model_version, shapes=shapes, body=body or {},
            )
            frames = encode(header, payload, key=self.key)
            size = sum(len(f) for f in frames)
            if size > self.max_message_bytes:
                # The server would refuse it (or drop the connection); say so now.
                raise RemoteError(ErrorCode.TOO_LARGE.value, f"{type_.value} of {size} bytes exceeds the "
                                  f"server's limit of {self.max_message_bytes} bytes")
            assert self._sock is not None
            sent_at = time.monotonic()
            _send_parts(self._sock, frames)
            self.counter.bytes_sent += size
            reply = self._await_reply(self._seq, wait)
            if reply is not None:
                self.counter.answered_at = max(self.counter.answered_at, sent_at)
                return reply
            log.warning("no reply to %s within %.0fs (attempt %d/%d); reconnecting",
                        type_.value, wait, attempt + 1, attempts)
            self._connect()
        raise ServerUnreachable(f"data plane {self.address} did not answer {type_.value} ({attempts} attempts)")

    def _await_reply(self, seq: int, wait: float) -> Message | None:
        assert self._sock is not None
        deadline = time.monotonic() + wait
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            # In slices, so a cancel (stop, lost registration) ends a long barrier wait. A receive with a
            # timeout, not poll then receive: Socket.poll builds a Poller a call (issue 31, the agent's CPU).
            slice_ms = int(min(remaining, 0.25) * 1000)
            if slice_ms != self._rcvtimeo:
                self._sock.rcvtimeo = self._rcvtimeo = slice_ms
            try:
                frames = _recv_parts(self._sock)
            except zmq.Again:
                if self.cancel is not None and self.cancel.is_set():
                    raise RequestCancelled(f"wait for reply {seq} cancelled") from None
                continue
            self.counter.bytes_received += sum(len(f.buffer) for f in frames)
            try:
                msg = decode(frames)
            except ProtocolError as exc:
                log.warning("undecodable reply from server dropped: %s", exc)
                continue
            if msg.header.seq != seq:
                continue  # a late reply to a request we already gave up on
            if msg.header.type is MsgType.ERROR:
                # Unsigned: the server answers messages it could not authenticate too.
                error = parse_reply(ErrorReply, msg.header.body, "ERROR")
                raise RemoteError(error.code, error.message)
            if msg.header.session != self.session or not verify_mac(frames[0], msg.header, frames[1:], self.key):
                log.warning("reply %d without a valid server signature dropped", seq)
                continue
            return msg


# Frames smaller than this are copied into the message instead of sent zero-copy (pyzmq's default: 64 KiB). A
# zero-copy frame is released through pyzmq's garbage-collector thread, a wake-up of its own a request: a top-1%
# push of 1M parameters (80 KB) cost the agent 0.05-0.07 ms more CPU that way and its server 0.05-0.09 ms
# (four alternations, 2026-11-28, issue 31); a copy costs more from about 128 KiB (PUSH to PULL, copy or not, CPU
# of both processes: 80 KB 36 against 46 us a message to send, 256 KB 96 against 82).
SEND_COPY_BELOW = 128 * 1024

# Plain ints: pyzmq's flag enums build an enum object an operation (issue 31: the agent's CPU a push).
_SNDMORE = int(zmq.SNDMORE)


def _send_parts(sock: zmq.Socket, frames: list[Any]) -> None:
    """``send_multipart(frames, copy=False)`` without its type check a part and its flag enums (the frames are
    ``encode``'s: bytes, memoryviews, zmq.Frames). Blocking, as that is (a DEALER queues while it can)."""
    last = len(frames) - 1
    for i, part in enumerate(frames):
        sock.send(part, 0 if i == last else _SNDMORE, copy=False)


def _recv_parts(sock: zmq.Socket) -> list[zmq.Frame]:
    """``recv_multipart(copy=False)``: the first part waits (``zmq.Again`` after the receive timeout); the rest of
    a message arrives with it, ended by the frames' own ``more`` flag, not a RCVMORE getsockopt a part."""
    frame = sock.recv(copy=False)
    frames = [frame]
    while frame.more:
        frame = sock.recv(copy=False)
        frames.append(frame)
    return frames
