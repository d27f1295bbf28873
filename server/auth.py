"""Who may do what: the join token, the admin credential, registration rate
limits, and the data plane's signature and replay checks.

- Joining needs the operator's join token (``Authorization: Bearer ...``).
  A server refuses to start without one unless it is started ``--insecure``.
- Registration hands each worker its own secret; the data plane checks a
  MAC under it on every message (hermes.common.signing) and refuses
  replays: a (session, seq) pair never counts twice and a message's
  timestamp must be within ``replay_window`` seconds of the server clock.
- Operator endpoints (``/v1/stop``) need the admin token.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path

from hermes.common.clock import SYSTEM_CLOCK, Clock
from hermes.common.header import ErrorCode, Header, ProtocolError
from hermes.common.signing import MAX_SESSION_CHARS

log = logging.getLogger(__name__)

MIN_TOKEN_CHARS = 16


class AuthConfigError(ValueError):
    """A credential setting that cannot work (missing, too short, unreadable file)."""


def read_secret(value: str | None, file: str | None, name: str) -> str | None:
    """A secret from its setting or from a file (first line, stripped); both set is an error."""
    if value and file:
        raise AuthConfigError(f"{name}: set either the value or the file, not both")
    if file:
        try:
            lines = [ln.strip() for ln in Path(file).read_text().splitlines() if ln.strip()]
        except OSError as exc:
            raise AuthConfigError(f"{name}_file {file!r}: {exc.strerror or exc}") from None
        if not lines:
            raise AuthConfigError(f"{name}_file {file!r} is empty")
        value = lines[0]
    if value is not None and value != "" and len(value) < MIN_TOKEN_CHARS:
        raise AuthConfigError(f"{name} must be at least {MIN_TOKEN_CHARS} characters (e.g. openssl rand -hex 32)")
    return value or None


def bearer(authorization: str) -> str:
    scheme, _, credential = authorization.partition(" ")
    return credential.strip() if scheme.lower() == "bearer" else ""


def token_matches(given: str, expected: str | None) -> bool:
    return expected is not None and hmac.compare_digest(given.encode(), expected.encode())


class RateLimiter:
    """Token bucket per client address (``rate`` per second, ``burst`` deep).

    Failed attempts draw from the same bucket, so guessing the join token is
    as slow as registering. The table is pruned of full buckets so a flood
    from many addresses cannot grow it without bound.
    """

    def __init__(self, rate: float, burst: int, *, max_clients: int = 10_000, clock: Clock = SYSTEM_CLOCK) -> None:
        self.clock = clock
        self.rate, self.burst, self.max_clients = rate, burst, max_clients
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def allow(self, client: str) -> float:
        """0.0 when allowed, else the seconds until the next attempt would be."""
        if self.rate <= 0:
            return 0.0
        now = self.clock.monotonic()
        with self._lock:
            tokens, at = self._buckets.get(client, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - at) * self.rate)
            if tokens < 1.0:
                self._buckets[client] = (tokens, now)
                return (1.0 - tokens) / self.rate
            self._buckets[client] = (tokens - 1.0, now)
            if len(self._buckets) > self.max_clients:
                self._prune(now)
            return 0.0

    def _prune(self, now: float) -> None:
        full = [c for c, (t, at) in self._buckets.items() if t + (now - at) * self.rate >= self.burst]
        for c in full:
            del self._buckets[c]
        while len(self._buckets) > self.max_clients:  # all busy: drop the stalest
            del self._buckets[min(self._buckets, key=lambda c: self._buckets[c][1])]


@dataclass
class _Session:
    last_seq: int
    seen: float


class ReplayGuard:
    """Per worker: sessions with the last accepted seq, and a freshness window.

    A message is fresh when ``|ts - now| <= window``. Within a session seq
    must grow strictly. A session idle for twice the window is forgotten: a
    replay of any of its messages is then stale by its timestamp alone. At
    most ``max_sessions`` live sessions per worker (an agent uses two or
    three); more is refused rather than evicted, so eviction can never
    reopen a replay.
    """

    def __init__(self, window_seconds: float, *, max_sessions: int = 64, clock: Clock = SYSTEM_CLOCK) -> None:
        self.clock = clock
        self.window_ms = int(window_seconds * 1000)
        self.max_sessions = max_sessions
        self._sessions: dict[str, dict[str, _Session]] = {}
        self._lock = threading.Lock()

    def check(self, header: Header) -> None:
        """Raises ProtocolError(REPLAY) for a stale or repeated message; records it otherwise.

        Call only after the MAC verified: unauthenticated input must not move the counters.
        """
        now = int(self.clock.time() * 1000)  # the agents' offset is taken against this clock (now_ms)
        if abs(header.ts - now) > self.window_ms:
            raise ProtocolError(ErrorCode.REPLAY, f"message timestamp {header.ts} is more than "
                                f"{self.window_ms} ms from the server clock ({now}); replayed or clock skew")
        if not header.session or len(header.session) > MAX_SESSION_CHARS:
            raise ProtocolError(ErrorCode.REPLAY, f"session id must be 1..{MAX_SESSION_CHARS} characters")
        mono = self.clock.monotonic()
        with self._lock:
            sessions = self._sessions.setdefault(header.worker, {})
            s = sessions.get(header.session)
            if s is None:
                if len(sessions) >= self.max_sessions:
                    self._expire(sessions, mono)
                if len(sessions) >= self.max_sessions:
                    raise ProtocolError(ErrorCode.REPLAY, f"worker {header.worker} has {self.max_sessions} "
                                        "live data-plane sessions; refusing a new one")
                sessions[header.session] = _Session(header.seq, mono)
                return
            if header.seq <= s.last_seq:
                raise ProtocolError(ErrorCode.REPLAY, f"seq {header.seq} of session {header.session} already "
                                    f"seen (last {s.last_seq}): replayed message")
            s.last_seq, s.seen = header.seq, mono

    def _expire(self, sessions: dict[str, _Session], mono: float) -> None:
        horizon = mono - 2 * self.window_ms / 1000
        for sid in [sid for sid, s in sessions.items() if s.seen < horizon]:
            del sessions[sid]

    def forget(self, worker_id: str) -> None:
        """A worker rejoined with a new key: its old sessions cannot verify any more."""
        with self._lock:
            self._sessions.pop(worker_id, None)


def new_secret() -> str:
    return secrets.token_urlsafe(32)
