"""Compatibility shim: moved to ``hermes.common.policies.allocation.task_allocation``."""

from hermes.common.policies.allocation.task_allocation import AdaptiveAllocator  # noqa: F401
