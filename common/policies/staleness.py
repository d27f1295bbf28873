"""Staleness functions s(t - tau): how much an update computed on an old model still counts.

FedAsync (Xie, Koyejo, Gupta, "Asynchronous Federated Optimization", 2019,
arXiv:1903.03934, Sec. 5.2) defines three, each in (0, 1]:

- constant: s = 1;
- polynomial: s_a(t - tau) = (t - tau + 1)^(-a);
- hinge: s_{a,b}(t - tau) = 1 if t - tau <= b, else 1 / (a (t - tau - b) + 1).

FedAsync scales its mixing weight by s (``federated.FedAsync``); the loss rule
(``aggregation.LossWeighted``, ``loss.staleness``) scales a since-pull delta's
share by it. A separate module so both import it without a loop.
"""

from __future__ import annotations

from typing import Literal

__all__ = ["StalenessFunction", "staleness_weight"]

StalenessFunction = Literal["constant", "polynomial", "hinge"]


def staleness_weight(function: StalenessFunction, staleness: int, a: float, b: int = 0) -> float:
    """s(t - tau) of FedAsync Sec. 5.2, in (0, 1]."""
    if staleness < 0:
        raise ValueError(f"staleness must be >= 0, got {staleness}")
    if function == "constant":
        return 1.0
    if function == "polynomial":
        return float((staleness + 1) ** -a)
    if function == "hinge":
        return 1.0 if staleness <= b else 1.0 / (a * (staleness - b) + 1.0)
    raise ValueError(f"unknown staleness function {function!r}")
