"""The one process helper of the launchers (testbed, bench, broker) and the tests.

- ``free_ports`` / ``free_port`` / ``port_is_free``: loopback ports (each one handed out is reserved
  for a while across this user's processes, so parallel launchers never share one);
- ``start``: a child in a session (process group) of its own, output to a log file;
  ``Proc``: such a child as a launcher keeps it, with its name, log and what it was started with;
- ``wait_healthy`` / ``wait_ready``: poll until it answers, with a deadline,
  failing fast (with the tail of its output) if it died meanwhile;
- ``terminate_group``: SIGTERM its group, SIGKILL what is left.

The server and the agents are reached through their command lines only:
nothing here imports them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hermes.common.atomic_write import write_atomic

log = logging.getLogger(__name__)


class StartupError(RuntimeError):
    """A child process died during start-up or did not become ready in time (the message holds its output tail)."""


@dataclass
class Proc:
    """A started child as a launcher keeps it: its name, process, log file and what it was started with."""

    name: str
    popen: subprocess.Popen
    log_path: Path
    info: dict[str, Any]


# ---------------------------------------------------------------------------- ports


# A port handed out stays reserved this long for the child that will bind it (a server's start-up
# under load can take tens of seconds); once bound, the kernel keeps it from everyone else.
PORT_RESERVATION_SECONDS = 300.0


def free_ports(count: int, host: str = "127.0.0.1", *, registry: Path | None = None,
               clock: Callable[[], float] = time.time) -> list[int]:
    """``count`` distinct ports on ``host`` that were free a moment ago, none handed out by any process
    of this user (this one included) in the last ``PORT_RESERVATION_SECONDS``.

    A port is free from this call until its child binds it: two draws (a testbed's server and broker,
    parallel tests, a bench beside a testbed) could be given the same one in that window. The kernel's
    ephemeral ports are drawn here, and every draw is noted, under a file lock, in ``registry`` (a JSON
    file of port -> time, by default in the temp dir per user); a draw still reserved is skipped.
    """
    user = getattr(os, "getuid", lambda: "")()  # per user: another user's file is not ours to lock
    path = registry or Path(tempfile.gettempdir()) / f"hermes-ports-{user}.json"
    with _locked(path.with_suffix(".lock")):
        now = clock()
        try:
            held = {int(p): t for p, t in json.loads(path.read_text()).items()
                    if now - float(t) < PORT_RESERVATION_SECONDS}
        except (OSError, ValueError, TypeError, AttributeError):  # a broken registry starts afresh
            held = {}
        ports = _draw(count, host, set(held))
        held.update({p: now for p in ports})
        with contextlib.suppress(OSError):  # an unwritable registry only loses the reservation
            write_atomic(path, json.dumps(held))
        return ports


def _draw(count: int, host: str, taken: set[int]) -> list[int]:
    """``count`` ports from the kernel (all held open at once, so distinct), none in ``taken``."""
    socks: list[socket.socket] = []
    picked: list[int] = []
    try:
        while len(socks) < count + 256:  # each draw held open (distinct); a bound on the fds used
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
            if (port := s.getsockname()[1]) not in taken:
                picked.append(port)
                if len(picked) == count:
                    return picked
        raise OSError(f"no {count} free ports on {host} outside the {len(taken)} reserved")
    finally:
        for s in socks:
            s.close()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # no flock (Windows): draws are then only as distinct as the kernel makes them
        yield
        return
    try:
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def free_port(host: str = "127.0.0.1", *, registry: Path | None = None) -> int:
    return free_ports(1, host, registry=registry)[0]


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when nothing listens on ``port`` (TIME_WAIT leftovers do not count)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind((host, port))
        return True
    except OSError:
        return False
    finally:
        s.close()


# ---------------------------------------------------------------------------- start


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None]:
    """A ``preexec_fn``: the child gets ``sig`` when the thread that started it dies (Linux), even by
    SIGKILL, so a crashed launcher or test run leaves no orphans. Start children from a long-lived
    thread (the main one)."""

    def arm() -> None:
        if sys.platform.startswith("linux"):
            import ctypes

            pr_set_pdeathsig = 1
            ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, sig)

    return arm


def start(cmd: Sequence[str], *, log_path: Path | None, env: Mapping[str, str] | None = None,
          cwd: str | os.PathLike[str] | None = None, append: bool = False,
          parent_death_signal: int | None = None) -> subprocess.Popen[bytes]:
    """Start ``cmd`` in a session of its own (one killpg reaches it and its children), stdout and
    stderr to ``log_path`` (None: discarded), stdin closed."""
    out = open(log_path, "ab" if append else "wb") if log_path is not None else None  # noqa: SIM115 - the child owns it
    try:
        return subprocess.Popen(list(cmd), stdout=out if out is not None else subprocess.DEVNULL,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                env=dict(env) if env is not None else None, cwd=cwd,
                                preexec_fn=die_with_parent(parent_death_signal) if parent_death_signal else None)
    finally:
        if out is not None:
            out.close()


def tail(path: Path | None, chars: int = 4000) -> str:
    """The end of a child's output, for error messages ('' when there is none)."""
    if path is None:
        return ""
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


# ---------------------------------------------------------------------------- wait


def wait_ready(proc: subprocess.Popen, ready: Callable[[], bool], *, timeout: float, what: str,
               log_path: Path | None = None, interval: float = 0.1, state: str = "ready") -> None:
    """Poll ``ready()`` until it is true; StartupError at once if ``proc`` exits, or after ``timeout`` s.

    ``ready`` answers False (never raises) while the process is not listening yet.
    """
    deadline = time.monotonic() + timeout
    where = f"; see {log_path}" if log_path is not None else ""
    while True:
        if proc.poll() is not None:
            raise StartupError(f"{what} exited with code {proc.returncode} during start-up{where}:\n{tail(log_path)}")
        if ready():
            return
        if time.monotonic() > deadline:
            raise StartupError(f"{what} did not become {state} within {timeout:g}s{where}:\n{tail(log_path)}")
        time.sleep(interval)


def healthy(url: str, *, timeout: float = 1.0, ssl_context: ssl.SSLContext | None = None) -> bool:
    """True when ``GET url/healthz`` answers 200 with ``"status": "ok"``."""
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=timeout, context=ssl_context) as r:
            return r.status == 200 and json.loads(r.read()).get("status") == "ok"
    except (urllib.error.URLError, OSError, ValueError):
        return False


def wait_healthy(proc: subprocess.Popen, url: str, *, timeout: float, what: str = "server",
                 log_path: Path | None = None, ssl_context: ssl.SSLContext | None = None,
                 interval: float = 0.1) -> None:
    """Wait until the server at ``url`` answers ``/healthz``; StartupError (with its output tail)
    if it exits first or is not healthy within ``timeout`` seconds."""
    wait_ready(proc, lambda: healthy(url, ssl_context=ssl_context), timeout=timeout, what=what,
               log_path=log_path, interval=interval, state="healthy")


# ---------------------------------------------------------------------------- stop


def terminate_group(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM the process's group, SIGKILL whatever is left after ``grace``.

    The launchers start each child in a session of its own, so the group
    also holds anything the child started (the SIGKILL sweep reaches a
    killed parent's children too).
    """
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            log.warning("pid %d still up %.0fs after SIGTERM; killing it", proc.pid, grace)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
