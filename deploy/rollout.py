"""The roll-out runner: each command runs on many hosts at once and returns one result per host.

The commands themselves live beside it: ``rollout_install`` (check, install)
and ``rollout_agent`` (start, status, stop, logs, fetch). This module holds
what they share: the per-host fan-out, the result type, and the shell helpers
their scripts are built from.

Layout on a device (``workdir``, default ``~/hermes-edge``)::

    wheels/hermes_edge-*.whl    the wheel last installed
    venv/                       the agent's virtual environment
    run/agent.pid               pid of the running agent (its own session)
    logs/agent.log              its output; the previous run's is agent.log.1

Every host runs in its own daemon thread with a deadline: a host that does not
answer is reported as failed when its time is up, and neither blocks the
others nor keeps the process alive (a ThreadPoolExecutor's workers are joined
at interpreter exit, which is why plain daemon threads are used).
"""

from __future__ import annotations

import logging
import os
import shlex
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from hermes.deploy.inventory import Host
from hermes.deploy.remote import CommandResult, RemoteError, RemoteSession

log = logging.getLogger(__name__)


class CommandFailed(Exception):
    """A command ran on the device and failed there; the message says why."""

    def __init__(self, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.details = details or {}


@dataclass
class HostResult:
    host: str
    ok: bool
    summary: str
    details: dict[str, Any] = field(default_factory=dict)
    error_kind: str | None = None
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"host": self.host, "ok": self.ok, "summary": self.summary, "error_kind": self.error_kind,
                "seconds": round(self.seconds, 3), "details": self.details}


@dataclass(frozen=True)
class Options:
    known_hosts: Path
    trust_on_first_use: bool = False
    timeout: float = 120.0  # per host, connect included
    parallel: int = 16


HostAction = Callable[[Host, RemoteSession], tuple[str, dict[str, Any]]]


# ---------------------------------------------------------------------------
# fan-out


def run_on_hosts(hosts: tuple[Host, ...] | list[Host], action: HostAction, options: Options) -> list[HostResult]:
    """Connect to every host and run ``action`` there, ``options.parallel`` at a time; results in host order."""
    results: dict[str, HostResult] = {}
    sessions: dict[str, RemoteSession] = {}
    started: dict[str, float] = {}
    lock = threading.Lock()
    gate = threading.Semaphore(max(1, options.parallel))

    def work(host: Host) -> None:
        with gate:
            t0 = time.monotonic()
            session = RemoteSession(host, known_hosts=options.known_hosts,
                                    trust_on_first_use=options.trust_on_first_use)
            with lock:
                if host.name in results:  # timed out while queued
                    return
                started[host.name] = t0
                sessions[host.name] = session
            result = _run_one(host, session, action)
            result.seconds = time.monotonic() - t0
            with lock:
                results.setdefault(host.name, result)

    threads = []
    for host in hosts:
        t = threading.Thread(target=work, args=(host,), name=f"deploy-{host.name}", daemon=True)
        t.start()
        threads.append(t)
    while True:
        with lock:
            now = time.monotonic()
            for host in hosts:
                t0 = started.get(host.name)
                if host.name not in results and t0 is not None and now - t0 > options.timeout:
                    log.warning("%s: no result after %.0fs, giving up on it", host.name, options.timeout)
                    results[host.name] = HostResult(host.name, False, f"timeout: no result within {options.timeout:g}s",
                                                    error_kind=RemoteError.TIMEOUT, seconds=now - t0)
                    sessions[host.name].abort()
            if len(results) == len(hosts):
                break
        time.sleep(0.05)
    return [results[h.name] for h in hosts]


def _run_one(host: Host, session: RemoteSession, action: HostAction) -> HostResult:
    try:
        with session:
            summary, details = action(host, session)
        return HostResult(host.name, True, summary, details)
    except RemoteError as exc:
        log.info("%s: %s", host.name, exc)
        return HostResult(host.name, False, str(exc), error_kind=exc.kind)
    except CommandFailed as exc:
        log.info("%s: %s", host.name, exc)
        return HostResult(host.name, False, str(exc), exc.details, error_kind="command")
    except Exception as exc:
        log.exception("%s: unexpected error", host.name)
        return HostResult(host.name, False, f"error: {type(exc).__name__}: {exc}", error_kind="error")


# ---------------------------------------------------------------------------
# shell helpers


def remote_path(workdir: str, *parts: str) -> str:
    """A path on the device: ``~/x`` and relative paths are relative to the login directory (home)."""
    if workdir == "~":
        workdir = "."
    elif workdir.startswith("~/"):
        workdir = workdir[2:] or "."
    return str(PurePosixPath(workdir, *parts))


def shown(path: str) -> str:
    """A remote path as a person reads it: relative ones are under the home directory."""
    return path if path.startswith("/") else "~/" + path.removeprefix("./")


def quote(value: str | os.PathLike[str]) -> str:
    """One shell word for ``value``."""
    return shlex.quote(str(value))


# Shell functions every script gets. alive PID: the process exists, is not a
# zombie and is a hermes-client (a recycled pid is not mistaken for ours).
_PRELUDE = r"""
alive() {
    [ -n "$1" ] || return 1
    kill -0 "$1" 2>/dev/null || return 1
    if [ -r "/proc/$1/stat" ]; then
        state=$(sed 's/.*) //' "/proc/$1/stat" | cut -c1)
        [ "$state" = Z ] && return 1
        tr '\0' ' ' < "/proc/$1/cmdline" 2>/dev/null | grep -q hermes-client || return 1
    fi
    return 0
}
# gone PID: no such process, or a zombie. ``alive`` turns false once an exiting process has
# no memory left (its cmdline reads empty); this waits for the exit to complete.
gone() {
    kill -0 "$1" 2>/dev/null || return 0
    [ "$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -c1)" = Z ]
}
# killtree PID: SIGKILL the agent and its process group (the shell waiting for it leads the group).
killtree() {
    pg=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f3)
    [ -n "$pg" ] && [ "$pg" != 0 ] && kill -KILL "-$pg" 2>/dev/null
    kill -KILL "$1" 2>/dev/null
}
"""


def script(*lines: str) -> str:
    """A shell script: the shared functions above (alive, gone, killtree), then ``lines``."""
    return _PRELUDE + "\n".join(lines) + "\n"


def require_ok(res: CommandResult, what: str, details: dict[str, Any] | None = None) -> CommandResult:
    """``res``; CommandFailed (what, exit code, output tail) when it exited non-zero."""
    if res.rc != 0:
        raise CommandFailed(f"{what} failed (exit {res.rc}): {res.tail()}", details)
    return res

