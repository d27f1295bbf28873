"""Direction screening: does an update agree with the recent consensus of accepted updates?

A norm bound alone lets through the reverse of the honest step at any size
under the bound (issue 29: ``asp`` at k = 10 x the median norm, 0 refusals,
0.972 -> 0.469). What tells such an update apart is its direction, so each
update is compared with a robust reference of the recent accepted ones:

* **The reference** is the coordinate-wise median (Yin et al. 2018, "Byzantine-
  robust distributed learning", Eq. (median)) of the latest accepted update of each
  *other* worker, among the last ``window`` accepted ones. One entry per worker
  caps what one worker (or a Sybil that keeps one id) adds to the reference; the
  pusher's own entry is left out so it cannot agree with itself. Zeno++ (Xie et
  al. 2020, Alg. 1) scores an update against a direction the server trusts the
  same way, there a gradient on server-held data; here the server's own evidence is
  the accepted updates, so a minority cannot move the median coordinate by
  coordinate.
* **The test**: ``cos(u, r) >= min_cosine x direction_norm_factor / (||u|| / median)``. The reverse of an honest step has
  the reverse sign of the honest one's agreement, so a negative bound refuses it
  while honest updates (noisy, but on the consensus side) pass.
* **Warm-up**: no test until ``min_workers`` other workers have an accepted entry;
  before that the norm bootstrap (model-scale bound, loss probe) is the guard.

Cosines are taken on a fixed, seeded subset of at most ``sketch`` coordinates:
an unbiased estimate of the full inner products at bounded memory
(``window`` x ``sketch`` floats), whatever the model's size.
"""

from __future__ import annotations

import math
from collections import deque

import torch


def cosine(a: torch.Tensor, b: torch.Tensor) -> float | None:
    """cos(a, b); None when either is zero or the product overflows."""
    denom = float(torch.linalg.vector_norm(a)) * float(torch.linalg.vector_norm(b))
    if denom == 0.0 or not math.isfinite(denom):
        return None
    return float(torch.dot(a, b)) / denom


class DirectionReference:
    """The last ``window`` accepted updates' sketches, by worker; the robust reference and the test."""

    def __init__(self, numel: int, *, window: int, sketch: int, min_workers: int, seed: int = 0x5C4EE) -> None:
        self.numel = numel
        self.min_workers = min_workers
        self.index: torch.Tensor | None = None
        if numel > sketch:
            gen = torch.Generator().manual_seed(seed)
            self.index = torch.randperm(numel, generator=gen)[:sketch].sort().values
        self.accepted: deque[tuple[str, torch.Tensor]] = deque(maxlen=window)

    def sketch(self, step: torch.Tensor) -> torch.Tensor:
        """The update on the reference's coordinates (fp32)."""
        step = step.to(torch.float32)
        return step if self.index is None else step.index_select(0, self.index)

    def reference(self, worker_id: str) -> torch.Tensor | None:
        """Coordinate-wise median of the other workers' latest accepted sketches; None in warm-up."""
        latest: dict[str, torch.Tensor] = {}
        for wid, s in reversed(self.accepted):
            if wid != worker_id and wid not in latest:
                latest[wid] = s
        if len(latest) < self.min_workers:
            return None
        # quantile, not median(): the mean of the two middle values for an even count.
        return torch.quantile(torch.stack(list(latest.values())), 0.5, dim=0)

    def cosine(self, worker_id: str, sketch: torch.Tensor) -> float | None:
        """cos(sketch, reference); None in warm-up or when either is zero."""
        ref = self.reference(worker_id)
        return None if ref is None else cosine(sketch, ref)

    def accept(self, worker_id: str, sketch: torch.Tensor) -> None:
        if float(torch.linalg.vector_norm(sketch)) > 0.0:
            self.accepted.append((worker_id, sketch))

    def workers(self) -> int:
        return len({wid for wid, _ in self.accepted})
