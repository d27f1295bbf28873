"""The agent's heartbeat: a thread that tells the server it is alive.

Training cycles can be long and the data-plane socket belongs to the
training thread, so liveness goes over the control plane. The thread also
notices when the server no longer knows this worker (it was marked lost, or
the server restarted and issued new secrets: HTTP 401/404/410) or has been
unreachable for a while, and calls ``on_lost`` so the agent re-registers.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from hermes.client.transport import (
    ControlClient,
    RemoteError,
    ServerUnreachable,
    StopRequested,
)
from hermes.common.clock import SYSTEM_CLOCK, Clock
from hermes.common.control_messages import HeartbeatReply
from hermes.common.wire import ProtocolError

log = logging.getLogger(__name__)

FORGOTTEN = frozenset({"http_401", "http_404", "http_410"})


class Heartbeat:
    def __init__(self, control: ControlClient, worker_id: str, token: str, *, interval: float,
                 on_lost: Callable[[str], None], unreachable_after: float = 30.0,
                 on_reply: Callable[[HeartbeatReply], None] | None = None, clock: Clock = SYSTEM_CLOCK,
                 heard_within: Callable[[float], bool] | None = None) -> None:
        self.control = control
        self.worker_id, self.token = worker_id, token
        self.interval = interval
        self.on_lost = on_lost
        # Sees each reply (topology collective: the server says when the group is re-forming).
        self.on_reply = on_reply
        self.unreachable_after = max(unreachable_after, 3 * interval)
        self.sent = 0
        # combine_messages: True when the server answered a data-plane request sent within the
        # last ``interval`` seconds; that request already told it we are alive, so no beat.
        self.heard_within = heard_within
        self.skipped = 0
        # Measures how long the server has been silent (tests move a ManualClock instead of waiting).
        self.clock = clock
        self._last_ok = clock.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hermes-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.control.timeout + 1)

    def _run(self) -> None:
        self._last_ok = self.clock.monotonic()
        while not self._stop.wait(self.interval):
            if not self.tick():
                return

    def tick(self) -> bool:
        """One interval's turn: a beat, or none when the data plane spoke for us; False once lost."""
        if self.heard_within is not None and self.heard_within(self.interval):
            self.skipped += 1
            self._last_ok = self.clock.monotonic()
            return True
        return self.beat()

    def beat(self) -> bool:
        """One heartbeat; False once the server is taken to have lost us (``on_lost`` was called)."""
        try:
            reply = self.control.heartbeat(self.worker_id, self.token)
            self.sent += 1
            if self.on_reply is not None:
                self.on_reply(reply)
            self._last_ok = self.clock.monotonic()
        except ProtocolError as exc:
            # An answer we cannot read is still an answer: the server heard us.
            self.sent += 1
            self._last_ok = self.clock.monotonic()
            log.warning("heartbeat answered but %s", exc.message)
        except RemoteError as exc:
            if exc.code in FORGOTTEN:
                self.on_lost(f"the server no longer knows worker {self.worker_id} ({exc})")
                return False
            log.info("heartbeat refused: %s", exc)
        except (ServerUnreachable, StopRequested) as exc:
            quiet = self.clock.monotonic() - self._last_ok
            log.info("heartbeat failed (%.0fs without an answer): %s", quiet, exc)
            if quiet > self.unreachable_after:
                self.on_lost(f"server unreachable for {quiet:.0f}s")
                return False
        return True
