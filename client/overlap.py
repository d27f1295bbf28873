"""Overlapped exchange (run config ``overlap_push``): push cycle k while cycle k+1 trains.

An agent that waits for its push's reply idles for a round trip and two
model transfers every cycle: on an LTE uplink 0.35 s for the 0.43 MB of a
110K-parameter CNN, about a cycle's worth of its compute. DaSGD (Zhou et
al. 2020, "Squeezing SGD Parallelization Performance in Distributed
Training Using Delayed Averaging", arXiv:2006.00441) hides the exchange
behind the next cycle's training: the model that comes back after the delay
is combined with the local updates made meanwhile. Here, under an
asynchronous sync policy only (a barrier's next cycle must start from the
barrier's model):

1. cycle k ends: push its change (the reply brings the newer model,
   combine_messages) on a socket of its own, in a background thread; keep
   w_pushed, the local model as pushed;
2. cycle k+1 (and the next ones, while the reply is not in) trains on,
   from w_pushed;
3. the first cycle that ends with the reply in: take it, then rebase
   w_local <- w_server + (w_local - w_pushed), so that the next push
   carries exactly cycle k+1's progress against the model it is now based
   on. A rejected push whose reply brings no newer model leaves w_local as
   it is: its change goes again with the next push, as without overlap.

One push is in flight at a time. A cycle that ends before the reply is in
does not wait for it: it is reported as ``in-flight`` (not judged by the
gate, not pushed), and its progress goes with the first push after the
reply, so the push rate follows what the link carries and the agent never
idles for the network while there is training to do. The gate's Hermes
Alg. 1 decision is taken on the cycles that end with no push in flight.
``overlap_push=false`` (the default) is every paper's exchange.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from hermes.client.transport import DataClient
from hermes.common.wire import Message

log = logging.getLogger(__name__)


def rebase(server_model: torch.Tensor, local: torch.Tensor, pushed: torch.Tensor) -> torch.Tensor:
    """DaSGD's delayed averaging: the model that arrived plus what this worker learned since it pushed."""
    return server_model + (local - pushed)


class OverlappedPush:
    """At most one push in flight, sent on its own data-plane socket by one background thread."""

    def __init__(self, make_client: Callable[[], DataClient]) -> None:
        self._make_client = make_client
        self._client: DataClient | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._inflight: Future[Message] | None = None
        self._pushed: torch.Tensor | None = None
        # Seconds from each push's send to its reply: what overlapping hides (less the agent's waits);
        # and seconds the agent waited in take() for a reply not yet in.
        self.exchange_seconds = 0.0
        self.waited_seconds = 0.0

    @property
    def pending(self) -> bool:
        return self._inflight is not None

    @property
    def answered(self) -> bool:
        """The push in flight has its reply (or failed): taking it will not wait."""
        return self._inflight is not None and self._inflight.done()

    def send(self, request: Callable[[DataClient], Message], pushed: torch.Tensor) -> None:
        """Start ``request`` on the push socket; ``pushed`` is the local model the push was taken from."""
        if self._inflight is not None:
            raise RuntimeError("a push is already in flight: take its reply first")
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hermes-push")
            self._client = self._make_client()
        client = self._client
        assert client is not None
        sent = time.perf_counter()

        def timed(client: DataClient) -> Message:
            reply = request(client)
            self.exchange_seconds += time.perf_counter() - sent
            return reply

        self._inflight, self._pushed = self._pool.submit(timed, client), pushed

    def take(self) -> tuple[Message, torch.Tensor]:
        """Wait for the reply of the push in flight: (reply, the local model as pushed). Raises what the push raised."""
        inflight, pushed = self._inflight, self._pushed
        if inflight is None or pushed is None:
            raise RuntimeError("no push in flight")
        self._inflight = self._pushed = None
        t0 = time.perf_counter()
        reply = inflight.result()
        self.waited_seconds += time.perf_counter() - t0
        return reply, pushed

    def close(self) -> None:
        """Wait for the thread (a cancelled or failed request ends it) and close the socket."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        if self._client is not None:
            self._client.close()
        self._pool = self._client = None
        if self._inflight is not None:
            log.info("an overlapped push's reply was not taken: the run ended before its next cycle did")
        self._inflight = self._pushed = None
