"""Set-up mistakes the agent can see for itself, each told in one line before it trains.

- a ``--server`` URL without ``http://`` (``check_server_url``);
- ``--server`` pointing at the ZeroMQ data port instead of the HTTP control
  port (``looks_like_data_port``): a ZeroMQ peer greets first with the ZMTP
  signature (``0xFF``, eight bytes, ``0x7F``), an HTTP server answers a request
  with ``HTTP/``; one round trip tells them apart, where an HTTP client would
  wait for its timeout and retry for minutes;
- a data-plane address the agent cannot reach (``data_plane_problem``): the
  server advertises ``--advertise-host``, 127.0.0.1 unless told otherwise,
  which is this device itself for an agent on another machine. ZeroMQ would
  connect silently and the first request would time out, again and again;
- the default worker name (``default_name``): the host name for the first
  agent on a host, ``host-2``, ``host-3`` ... for the next ones at the same
  time, so two agents started without ``--name`` never share one. The slot is
  an ``flock`` on a file in the temp folder, released when the process ends,
  so an agent restarted on the host takes its old name (and workload) back.
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import tempfile
import time
import urllib.parse
from typing import IO

log = logging.getLogger(__name__)

ZMTP_SIGNATURE_FIRST, ZMTP_SIGNATURE_LAST = 0xFF, 0x7F

# Held for the process's life: closing the file would release the name.
_name_lock: IO[bytes] | None = None


def check_server_url(url: str) -> str | None:
    """Why ``url`` cannot be a control-plane URL, or None."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return f"--server {url!r} is not an http:// or https:// URL; did you mean 'http://{url.split('://')[-1]}'?"
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        return f"--server {url!r}: the port is not a number"
    return None


def looks_like_data_port(url: str, timeout: float = 3.0) -> bool:
    """True when ``url``'s host:port speaks ZeroMQ rather than HTTP (one round trip).

    Anything else (refused, silent, TLS, a reply that is neither) is False:
    the ordinary registration retries deal with those.
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        return False
    try:
        with socket.create_connection((parts.hostname, parts.port or 80), timeout=timeout) as sock:
            sock.settimeout(timeout)
            try:
                sock.sendall(b"GET /healthz HTTP/1.0\r\nHost: " + parts.hostname.encode("idna") + b"\r\n\r\n")
            except OSError:
                pass  # a ZeroMQ peer may already have dropped us; its greeting may still be buffered
            head = _recv_at_least(sock, 10, timeout)
    except OSError:
        return False
    return len(head) >= 10 and head[0] == ZMTP_SIGNATURE_FIRST and head[9] & 0x7F == ZMTP_SIGNATURE_LAST


def _recv_at_least(sock: socket.socket, n: int, timeout: float) -> bytes:
    data = b""
    deadline = time.monotonic() + timeout
    while len(data) < n and time.monotonic() < deadline:
        try:
            chunk = sock.recv(n - len(data))
        except OSError:
            break
        if not chunk:
            break
        data += chunk
    return data


def data_plane_problem(address: str, timeout: float = 3.0) -> str | None:
    """Why this device cannot reach the advertised data plane ``tcp://HOST:PORT``, or None.

    A TCP connection and the ZMTP greeting within ``timeout`` prove that a
    ZeroMQ socket listens there; the server's own authentication of the
    first request proves the rest.
    """
    host, sep, port = address.removeprefix("tcp://").rpartition(":")
    if not sep or not port.isdigit():
        return f"the server advertised {address!r}, which is not tcp://HOST:PORT"
    host = host.strip("[]")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as sock:
            greeting = _recv_at_least(sock, 10, timeout)
    except OSError as exc:
        return f"cannot reach the data plane at {address} that the server advertises ({_reason(exc)})"
    if len(greeting) < 10 or greeting[0] != ZMTP_SIGNATURE_FIRST:
        return f"{address}, which the server advertises as its data plane, does not speak ZeroMQ"
    return None


def _reason(exc: OSError) -> str:
    if isinstance(exc, TimeoutError):
        return "no answer"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    return exc.strerror or str(exc)


def default_name(hostname: str | None = None, lock_dir: str | None = None, max_slots: int = 256) -> str:
    """The host name, or ``host-N`` for the N-th agent running on this host at the same time."""
    global _name_lock
    host = hostname or socket.gethostname() or "agent"
    folder = lock_dir or tempfile.gettempdir()
    uid = os.getuid() if hasattr(os, "getuid") else 0
    for slot in range(1, max_slots + 1):
        path = os.path.join(folder, f"hermes-agent-{uid}-{host}-{slot}.lock")
        try:
            f = open(path, "ab")  # noqa: SIM115 - held open for the process's life
        except OSError as exc:
            log.debug("no name slot file %s (%s); naming by process id", path, exc)
            break
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            continue
        _name_lock = f
        return host if slot == 1 else f"{host}-{slot}"
    return f"{host}-{os.getpid()}"
