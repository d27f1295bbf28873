"""Compatibility shim: moved to ``hermes.common.policies.allocation.dynamic_partitioning``."""

from hermes.common.policies.allocation.dynamic_partitioning import PartitionAllocator  # noqa: F401
