"""The run config's ``concurrency`` section: how many workers train at once (FedBuff's concurrency C).

FedBuff (Nguyen, Malik, Zhan, Yousefpour, Rabbat, Malek, Huba, "Federated
Learning with Buffered Asynchronous Aggregation", AISTATS 2022, Alg. 1 and
Sec. 3): the server keeps at most C clients training at a time; whenever one
reports its update, another is sampled in its place. With K updates per
server step, an update is about C / K server steps stale when it arrives
(Sec. 5: staleness grows with the concurrency), so C is what bounds the
staleness of every asynchronous rule, not only FedBuff's. Left unbounded, a
thousand devices that all train from version 0 send deltas about 1000 / K
versions stale (docs/simulation.md, "Scale").

Here a worker holds a slot from the work assignment that gave it one until
it reports a finished cycle (a push, or a cycle its gate did not push); then
the slot goes to the worker that has waited longest and the reporter's next
work request waits its turn. Leaving, being marked lost or registering again
frees the slot. A worker's prefetched work request is answered at once while
nobody waits. ``limit`` 0 (the default) admits everyone: a cluster no larger
than the limit never waits either. It applies to asynchronous sync policies
only: a barrier waits for every member, so a member kept idle would hold it
for good.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ConcurrencyParams"]


class ConcurrencyParams(BaseModel):
    """``concurrency``: the server's bound on workers training at once (FedBuff's C)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    limit: int = Field(
        default=0, ge=0, description="At most this many workers hold work at once (FedBuff's concurrency C, Nguyen "
        "et al. 2022 Alg. 1); the others' work requests wait, in order, for a slot that a finished cycle frees. "
        "0: no bound. Asynchronous sync policies only (a barrier waits for every member).")
