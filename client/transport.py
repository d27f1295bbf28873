"""The agent's two links to the server: HTTP control plane and ZeroMQ data plane.

Standard library HTTP (urllib) keeps the agent light: no fastapi, uvicorn or
HTTP client package on the device. A DataClient is one DEALER socket and is
used by one thread only (ZeroMQ sockets are not thread-safe); the prefetcher
has its own.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

import torch
import zmq

from hermes.common.wire import ErrorCode, Header, Message, MsgType, ProtocolError, decode, encode

log = logging.getLogger(__name__)


class ServerUnreachable(Exception):
    """The server did not answer within the retry budget."""


class RemoteError(Exception):
    """The server answered with an error reply."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class StopRequested(Exception):
    """The agent was told to stop (SIGTERM, Ctrl-C) while it waited for the server."""


class ControlClient:
    def __init__(
        self, base_url: str, *, timeout: float = 10.0, retries: int = 8, backoff: float = 0.5,
        stop: threading.Event | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        # Backoff waits on this, so a stop request ends the retries at once.
        self.stop = stop or threading.Event()

    def _call(self, method: str, path: str, body: dict | None = None, headers: dict | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.base_url + path, data=data, method=method,
            headers={"Content-Type": "application/json", **(headers or {})},
        )
        delay, last = self.backoff, None
        for attempt in range(self.retries + 1):
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    return json.loads(resp.read() or b"null")
            except urllib.error.HTTPError as exc:
                detail = exc.read().decode(errors="replace")[:500]
                if exc.code in (502, 503, 504) and attempt < self.retries:
                    last = f"HTTP {exc.code}: {detail}"
                else:
                    raise RemoteError(f"http_{exc.code}", detail) from None
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as exc:
                last = str(getattr(exc, "reason", exc))
            if attempt < self.retries:
                log.info("server %s not reachable (%s); retry %d/%d in %.1fs",
                         self.base_url, last, attempt + 1, self.retries, delay)
                if self.stop.wait(delay):
                    raise StopRequested(f"stopped while waiting for the server at {self.base_url}")
                delay = min(delay * 2, 10.0)
        raise ServerUnreachable(f"server {self.base_url} unreachable after {self.retries + 1} attempts: {last}")

    def register(self, **fields: Any) -> dict[str, Any]:
        return self._call("POST", "/v1/workers/register", fields)

    def leave(self, worker_id: str, token: str) -> None:
        self._call("POST", f"/v1/workers/{worker_id}/leave", {}, headers={"X-Hermes-Token": token})

    def status(self) -> dict[str, Any]:
        return self._call("GET", "/v1/status")


@dataclass
class TrafficCounter:
    bytes_sent: int = 0
    bytes_received: int = 0


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
    ) -> None:
        self.address = address
        self.worker_id = worker_id
        self.token = token
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
        sock.connect(self.address)
        self._sock = sock

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
            header = Header(
                type=type_, worker=self.worker_id, token=self.token, seq=self._seq,
                model_version=model_version, shapes=shapes, body=body or {},
            )
            frames = encode(header, payload)
            assert self._sock is not None
            self._sock.send_multipart(frames, copy=False)
            self.counter.bytes_sent += sum(len(f) for f in frames)
            reply = self._await_reply(self._seq, wait)
            if reply is not None:
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
            if remaining <= 0 or not self._sock.poll(int(remaining * 1000)):
                return None
            frames = self._sock.recv_multipart(copy=False)
            self.counter.bytes_received += sum(len(f.buffer) for f in frames)
            try:
                msg = decode(frames)
            except ProtocolError as exc:
                log.warning("undecodable reply from server dropped: %s", exc)
                continue
            if msg.header.seq != seq:
                continue  # a late reply to a request we already gave up on
            if msg.header.type is MsgType.ERROR:
                raise RemoteError(str(msg.header.body.get("code", ErrorCode.INTERNAL.value)),
                                  str(msg.header.body.get("message", "")))
            return msg
