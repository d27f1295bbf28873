"""Set-up mistakes the agent can see for itself, each told in one line before it trains.

- a ``--server`` URL without ``http://`` (``check_server_url``);
- ``--server`` pointing at the ZeroMQ data port instead of the HTTP control
  port, or at nothing (``first_contact``): a ZeroMQ peer greets first with the
  ZMTP signature (``0xFF``, eight bytes, ``0x7F``), an HTTP server answers a
  request with ``HTTP/``; one round trip tells them apart, where an HTTP
  client would wait for its timeout and retry for minutes;
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
import ssl
import tempfile
import threading
import time
import urllib.parse
from typing import IO

log = logging.getLogger(__name__)

ZMTP_SIGNATURE_FIRST, ZMTP_SIGNATURE_LAST = 0xFF, 0x7F

# Held for the process's life: closing the file would release the name.
_name_locks: list[IO[bytes]] = []


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


class DataPortGiven(Exception):
    """``--server`` names a ZeroMQ port: the server's data port, not its control port."""


class NotReachable(Exception):
    """No control plane answered within the retry budget."""


def probe_control_plane(url: str, timeout: float = 5.0, ssl_context: ssl.SSLContext | None = None) -> str | None:
    """One look at ``url``: None when an HTTP server answers there, else why not.

    Raises DataPortGiven when a ZeroMQ peer answers instead: it greets first
    with the ZMTP signature where an HTTP server replies ``HTTP/``, so one
    round trip tells them apart (an HTTP client would wait for its timeout).
    """
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            if parts.scheme == "https":
                head = _recv_at_least(sock, 10, min(timeout, 0.5))  # a TLS server waits for our hello
                if _is_zmtp(head):
                    raise DataPortGiven(url)
                ctx = ssl_context or ssl.create_default_context()
                with ctx.wrap_socket(sock, server_hostname=host) as tls:
                    tls.sendall(_healthz(host))
                    head = _recv_at_least(tls, 5, timeout)
            else:
                try:
                    sock.sendall(_healthz(host))
                except OSError:
                    pass  # a ZeroMQ peer may have dropped us already; its greeting is still buffered
                head = _recv_at_least(sock, 10, timeout)
    except ssl.SSLError:
        return None  # TLS trouble is the registration's to report: retrying will not fix it
    except OSError as exc:
        return _reason(exc)
    if _is_zmtp(head):
        raise DataPortGiven(url)
    if head.startswith(b"HTTP/"):
        return None
    return "no HTTP reply" if head else "connection closed without a reply"


def first_contact(url: str, *, retries: int, backoff: float = 0.5, timeout: float = 5.0,
                  ssl_context: ssl.SSLContext | None = None, stop: threading.Event | None = None) -> None:
    """Wait for the control plane with the registration's backoff (0.5 s doubling, at most 10 s).

    Done before the agent imports torch, so a wrong address fails in about
    a second instead of after the imports; the registration keeps its own
    retries for a server that goes away later.
    """
    stop = stop or threading.Event()
    delay, last = backoff, ""
    for attempt in range(retries + 1):
        problem = probe_control_plane(url, timeout, ssl_context)
        if problem is None:
            return
        last = problem
        if attempt < retries:
            log.info("server %s not reachable (%s); retry %d/%d in %.1fs", url, last, attempt + 1, retries, delay)
            if stop.wait(delay):
                return  # the caller sees the stop request and says so
            delay = min(delay * 2, 10.0)
    raise NotReachable(f"server {url} unreachable after {retries + 1} attempts: {last}")


def _healthz(host: str) -> bytes:
    return b"GET /healthz HTTP/1.0\r\nHost: " + host.encode("idna") + b"\r\n\r\n"


def _is_zmtp(head: bytes) -> bool:
    return len(head) >= 10 and head[0] == ZMTP_SIGNATURE_FIRST and head[9] & 0x7F == ZMTP_SIGNATURE_LAST


def tls_context(ca_file: str | None = None, cert_file: str | None = None,
                key_file: str | None = None) -> ssl.SSLContext | None:
    """Verification of the server against ``ca_file`` (system CAs without it) and an optional
    client certificate for servers that require one. None when no TLS option is given."""
    if not (ca_file or cert_file):
        return None
    ctx = ssl.create_default_context(cafile=ca_file)
    if cert_file:
        ctx.load_cert_chain(cert_file, key_file)
    return ctx


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
    if not _is_zmtp(greeting):
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
        _name_locks.append(f)
        return host if slot == 1 else f"{host}-{slot}"
    return f"{host}-{os.getpid()}"
