"""Compatibility shim: the allocation math moved to one module per paper under ``hermes.common.policies.allocation``."""

from hermes.common.policies.allocation.dynamic_partitioning import compute_power  # noqa: F401
from hermes.common.policies.allocation.memory_model import fit_memory_model, max_batch_for_memory  # noqa: F401
from hermes.common.policies.allocation.proportional_control import ProportionalController  # noqa: F401
from hermes.common.policies.allocation.rounding import InfeasibleAllocation, round_preserving_sum  # noqa: F401
from hermes.common.policies.allocation.static import static_batches  # noqa: F401
from hermes.common.policies.allocation.task_allocation import (  # noqa: F401
    AdaptiveAccumulation,
    task_allocation_targets,
)
