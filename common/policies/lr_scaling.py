"""Learning-rate scaling policies: ``none`` and OmniLearn's ``batch-scaled`` (Eq. 5b)."""

from __future__ import annotations

import logging
from typing import Any, ClassVar

from hermes.common.policies.base import Core, Policy, register

log = logging.getLogger(__name__)


def batch_scaled_lr(lr: float, batch: int, global_batch: int) -> float:
    """OmniLearn Eq. 5b: eta_k = eta * b_k / sum_i b_i (sum_i b_i = B = K*b).

    Literal: with uniform batches every worker steps at eta / K.
    """
    if lr <= 0 or batch <= 0 or global_batch <= 0:
        raise ValueError(f"lr, batch and global batch must be positive, got {lr}, {batch}, {global_batch}")
    return lr * batch / global_batch


class LrScaling(Policy):
    """The learning rate a push of ``batch`` samples is applied with, given the run's total batch."""

    # The rule reads the run's total batch: only then does the engine sum the active workers' batches.
    needs_global_batch: ClassVar[bool] = False

    @classmethod
    def build(cls, core: Core, *args: Any, **params: Any) -> LrScaling:
        return cls()

    def lr(self, base_lr: float, batch: int, global_batch: int) -> float:
        return base_lr


@register("lr_scaling", "none", "fixed")
class Fixed(LrScaling):
    """The run's learning rate for every push."""


@register("lr_scaling", "batch-scaled")
class BatchScaled(LrScaling):
    """eta_k = eta * b_k / B for asynchronous pushes (OmniLearn Eq. 5b)."""

    needs_global_batch: ClassVar[bool] = True

    requires: ClassVar[dict[str, str]] = {
        "asynchronous": "(OmniLearn Eq. 5b) is for asynchronous pushes; under {sync} aggregation 'samples' already "
                        "weighs each update by its batch (Eq. 4b), and scaling the learning rate too would count the "
                        "batch twice",
    }

    def lr(self, base_lr: float, batch: int, global_batch: int) -> float:
        return batch_scaled_lr(base_lr, batch, max(global_batch, batch))
