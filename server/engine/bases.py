"""The models from-baseline pushes are measured from: what makes a late joiner's update its real progress.

Presets whose aggregation rule declares ``update_from_baseline`` (FedAsync,
Hermes' loss blend with ``loss.reference`` baseline) have each agent push
G = w_worker - w_base, and fold the worker's model x_new = w_base + G
(FedAsync Alg. 1: x_t = (1 - a) x_{t-1} + a x_new; Hermes Alg. 2's w_temp).
The engine's blend, loss probe, screening and journal all read G against w0,
the run's first model. That is right only for an agent whose base is w0; a
late joiner, a restarted agent or a rejoin trains from a later model, and
its G read against w0 drags the model back towards w0 (issue 28).

So each registration of a from-baseline agent starts with a *base pull*
(``PullModel.base``): the server keeps the model it served as that worker's
base (its fp32 snapshot, shared with pulls, or the half-precision copy
widened exactly as the agent widens it), and every push names its base
(``PushUpdate.base_version``). ``rebased`` re-expresses G against w0,

    G0 = G + (w_base - w0),   so   w0 + G0 = w_base + G = x_new exactly,

which leaves every from-baseline fold (blend weight, candidate loss, screening
norm, journal replay) as it was: they all see the worker's real model. A
since-current conversion (w_base + G - w) would not do: FedAsync's mix needs
x_new itself, not a change relative to a model the worker never saw.

Memory: one model per live worker whose base is not w0 (version 0 needs no
copy), dropped when the worker leaves, is lost or registers again; so at most
``live workers`` models beside the global one and w0, and none at all for a
run whose agents all joined at the start. A push naming a base the server
does not keep (a server that restarted from a checkpoint keeps none) is
refused with ``rebase``: the agent pulls a new base and goes on.
"""

from __future__ import annotations

import logging

import torch

from hermes.common.wire import Payload

log = logging.getLogger(__name__)

__all__ = ["Bases"]


class Bases:
    """Each live from-baseline worker's base model, by worker id: ``pin`` at its base pull, ``drop`` when it goes."""

    def __init__(self, baseline: torch.Tensor) -> None:
        # w0 (ModelState.baseline): the frame the engine's from-baseline folds read G in.
        self.baseline = baseline
        self._pins: dict[str, tuple[int, torch.Tensor]] = {}

    def pin(self, worker_id: str, version: int, flat: torch.Tensor) -> None:
        """The model served to ``worker_id`` at its base pull (fp32, never written again)."""
        if version == 0:
            # w0 is kept anyway (ModelState.baseline).
            self._pins.pop(worker_id, None)
            return
        assert flat.dtype == torch.float32 and flat.numel() == self.baseline.numel(), (flat.dtype, flat.numel())
        self._pins[worker_id] = (version, flat)

    def drop(self, worker_id: str) -> None:
        self._pins.pop(worker_id, None)

    @property
    def count(self) -> int:
        """Base models kept beside w0 (at most the live workers)."""
        return len(self._pins)

    def base(self, worker_id: str, version: int) -> torch.Tensor | None:
        """The base ``worker_id`` measured its push from, None when it is not kept (the agent must rebase)."""
        if version == 0:
            return self.baseline
        pinned = self._pins.get(worker_id)
        return pinned[1] if pinned is not None and pinned[0] == version else None

    def rebased(self, payload: Payload, base: torch.Tensor) -> Payload:
        """G0 = G + (w_base - w0): the same worker model, measured from w0 (fp32)."""
        if base is self.baseline:
            return payload
        out = torch.empty(payload.numel, dtype=torch.float32)
        for off, piece in payload.fp32_pieces():
            n = piece.numel()
            torch.sub(base[off:off + n], self.baseline[off:off + n], out=out[off:off + n])
            out[off:off + n].add_(piece)
        payload.release_widened()
        return Payload(torch.float32, (out,), payload.shapes)
