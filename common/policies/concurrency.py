"""The run config's ``concurrency`` section: how many workers train at once (FedBuff's concurrency C).

FedBuff (Nguyen, Malik, Zhan, Yousefpour, Rabbat, Malek, Huba, "Federated
Learning with Buffered Asynchronous Aggregation", AISTATS 2022, Alg. 1; the
text is not among /work/shared/papers, so no line is cited): the server keeps
at most C clients training at a time; whenever one reports its update,
another is sampled in its place. With K updates per server step, an update
is about C / K server steps stale when it arrives, so C is what bounds the
staleness of every asynchronous rule, not only FedBuff's. Left unbounded, a
thousand devices that all train from version 0 send deltas about 1000 / K
versions stale (docs/simulation.md, "Scale").

Here a worker takes a slot with a work request and keeps it while nobody
waits; when others wait, its push ends its turn: the slot goes to the worker
that has waited longest, and the push's reply, which brings the model, waits
for the worker's next turn, so a worker always trains from a model that is
current when its turn begins (FedBuff's sampled client downloads the model
when it starts). A gate-skipped cycle also ends the turn (``turn_ends``
"cycle"), unless the turn lasts until the worker pushes (``turn_ends`` "push",
preset hermes: FedBuff's turn is one reported update). A pull from a
worker without a slot (its registration's) waits for a slot too and takes
it (``hold_pull``), so the first turn is as fresh as the others. Leaving, being
marked lost or registering again frees the slot. ``limit`` 0 (the default)
admits everyone: a cluster no larger than the limit never waits either.
Under ``overlap_push`` (preset hermes) a worker trains on while its push's
reply waits, so the bound holds for the workers' turns, not for every cycle
trained. It applies to sync policies that never wait for a member (free
running or buffered): a barrier, or SSP's bound, would wait for the idle ones.

Who gets a freed slot (``admit``): "fifo", the longest-waiting worker (the
default; FedBuff samples clients without regard to speed), or "fastest", the
waiting worker with the highest observed speed (samples a second of compute,
the median of its last cycle reports), after Oort's participant selection
(Lai, Zhu, Madhyastha, Chowdhury, "Oort: Efficient Federated Learning via
Guided Participant Selection", OSDI 2021, Sec. 4: a client's utility is its
statistical utility times a system-speed factor, with a bounded share of
exploration for clients never tried; the text is not among
/work/shared/papers, so no equation is cited). Here the statistical factor is
taken as equal for every worker (IID shards), so the order is speed alone:
"fastest" by samples a second of compute (the cycle reports, after the
claims' bounds), "quickest" by samples a second of the whole turn as the
server's clock times it, from the slot's grant to the push (Oort's round
duration: a fast device behind a slow uplink is not quick).
A worker never observed is tried while fewer than ``explore`` x limit slots
(at least one) are held by untried workers, oldest first (``explore_order``
"declared": the highest declared capacity first, Oort's use of a client's
reported device capacity before it has been seen); otherwise the
fastest known waits first. With 1,000 devices whose median is 6x slower
than the fastest, the C slots then go to the fast devices, whose deltas are
short and fresh (docs/simulation.md, "The 1,000-device table").
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ConcurrencyParams"]


class ConcurrencyParams(BaseModel):
    """``concurrency``: the server's bound on workers training at once (FedBuff's C)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    limit: int = Field(
        default=0, ge=0, description="At most this many workers hold work at once (FedBuff's concurrency C, Nguyen "
        "et al. 2022 Alg. 1); the others wait in order, and a push's reply (with the model) waits for the "
        "pusher's next turn when others wait. 0: no bound. Free-running or buffered sync policies only (a "
        "barrier, or SSP's bound, would wait for the idle workers).")
    hold_pull: bool = Field(
        default=True, description="A model pull from a worker without a slot (its registration's) waits for one and "
        "takes it, so its first turn trains from the model current when the turn begins, as the push's reply does "
        "(FedBuff's sampled client downloads the model when it starts). False: the pull is answered at once and "
        "the first turn trains from the registration's model (10,000 devices, limit 100: deltas up to ~800 "
        "versions stale).")
    # "cycle" gave hermes on 1,000 devices (limit 10-100) turns of one gated cycle: 2 warm-up cycles per device,
    # then mostly z-scores above the threshold, 9% of its cycles pushed, each push's delta spanning many turns and
    # so many versions stale (docs/simulation.md, "Hermes at 1,000 devices", 2026-11-27).
    turn_ends: Literal["cycle", "push"] = Field(
        default="cycle", description="What ends a worker's turn when others wait: 'cycle', any cycle it reports "
        "(a push, or a cycle its gate did not push); 'push', only a push (FedBuff's turn: one reported update), "
        "so a gated worker trains from its turn's model until its gate fires.")
    admit: Literal["fifo", "fastest", "quickest"] = Field(
        default="fifo", description="Who gets a freed slot: 'fifo', the longest-waiting worker; 'fastest', the "
        "waiting worker with the highest observed samples a second of compute (Oort's system utility, Lai et al. "
        "OSDI 2021); 'quickest', of its whole turn as the server times it (from the slot to the push: the "
        "transfers and replies included, Oort's round duration); untried workers first while fewer than "
        "explore x limit slots hold untried workers.")
    explore: float = Field(
        default=0.1, ge=0.0, le=1.0, description="With admit 'fastest': the share of the limit that untried workers "
        "may hold at once (at least one slot): Oort's bounded exploration.")
    # Under a gate a tried turn is 3+ cycles (2 warm-up losses, then the z-score), so the exploration share tries
    # devices 3-6x slower than without one: on 1,000 devices (hermes, 48 slots, 55 virtual s) 115 were tried and 42
    # of the 48 fastest never trained (docs/simulation.md, "Hermes with its own gate at 1,000 devices").
    explore_order: Literal["arrival", "declared"] = Field(
        default="arrival", description="With admit 'fastest' or 'quickest': which untried worker the exploration "
        "share tries next: 'arrival', the longest-waiting; 'declared', the highest compute capacity the worker "
        "declared when it registered (hints flops, else cores; none declared: after those that did, oldest first).")
