"""Compatibility shim: the allocation policies moved to ``hermes.common.policies.allocation``; import from there."""

from hermes.common.policies.allocation import (  # noqa: F401
    ALLOCATIONS,
    Allocator,
    AllocatorStateError,
    CycleObservation,
    Resize,
    Workload,
    local_steps,
    make_allocator,
)
