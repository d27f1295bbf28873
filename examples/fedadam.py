"""A policy plug-in: the FedAdam server optimizer (Reddi et al. 2021, "Adaptive Federated Optimization", Alg. 2).

The package has no adaptive server optimizer; this module adds one from outside it,
through the one policy registry, and a run selects it by name:

    import examples.fedadam   # registers aggregation 'fedadam'
    hermes.train(task, preset="bsp", config={"aggregation": "fedadam"}, max_seconds=30)

or, installed as a package, by an entry point (no import needed)::

    [project.entry-points."hermes.policies"]
    "aggregation.fedadam" = "examples.fedadam:FedAdam"

An aggregation rule answers weights (``weigh``); a rule whose ``op`` is
``"combine"`` also turns the step's updates (rows of ``stack``, each the
change a worker made since its pull) into the one delta the server adds to
the model. FedAdam averages them (Alg. 2 line 9) and feeds the mean to Adam
on the server (lines 10-12). Under a barrier (``bsp``) a step is the round's
updates; under asynchronous sync each push is a step of its own.

Parameters are class attributes (a subclass registered under another name
changes them). The moments are not checkpointed: a resumed run starts them
at zero again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from hermes.common.policies.aggregation import AggregationRule, Step, Update, Weighing
from hermes.common.policies.base import Core, register_policy


@register_policy("aggregation", "fedadam")
class FedAdam(AggregationRule):
    """Server-side Adam on the mean client delta (Reddi et al. 2021, Alg. 2, FedAdam)."""

    op = "combine"
    requires: ClassVar[dict[str, str]] = {
        "server_model": "keeps Adam's moments beside the server's model; {sync} with topology 'collective' has none"}
    # Reddi et al. 2021, Sec. 5 and Table 8: beta1 0.9, beta2 0.99, tau from {1e-3 ...}; eta tuned per task.
    eta: ClassVar[float] = 0.01
    beta1: ClassVar[float] = 0.9
    beta2: ClassVar[float] = 0.99
    tau: ClassVar[float] = 1e-3
    # Steps folded by any FedAdam of this process (read by the example's test).
    steps: ClassVar[int] = 0

    def __init__(self) -> None:
        self.m: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    @classmethod
    def build(cls, core: Core, *args: Any, **params: Any) -> FedAdam:
        return cls()

    def weigh(self, updates: Sequence[Update], step: Step, stack: Any = None) -> Weighing:
        # The step itself is combine() of the stack; the weights only describe it.
        return Weighing([1.0 / len(updates)] * len(updates), {"combined": self.name})

    def combine(self, stack: torch.Tensor) -> torch.Tensor:
        return self.adam_step(stack.mean(dim=0))

    def adam_step(self, delta: torch.Tensor) -> torch.Tensor:
        """The server's step for the round's mean delta Delta_t (Alg. 2 lines 10-12)."""
        if self.m is None or self.v is None:
            self.m, self.v = torch.zeros_like(delta), torch.zeros_like(delta)
        # Alg. 2 line 10: m_t = beta1 m_{t-1} + (1 - beta1) Delta_t
        self.m.mul_(self.beta1).add_(delta, alpha=1.0 - self.beta1)
        # Alg. 2 line 11 (FedAdam): v_t = beta2 v_{t-1} + (1 - beta2) Delta_t^2
        self.v.mul_(self.beta2).addcmul_(delta, delta, value=1.0 - self.beta2)
        type(self).steps += 1
        # Alg. 2 line 12: x_{t+1} = x_t + eta m_t / (sqrt(v_t) + tau)
        return self.eta * self.m / (self.v.sqrt() + self.tau)
