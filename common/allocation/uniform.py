"""Compatibility shim: moved to ``hermes.common.policies.allocation.uniform``."""

from hermes.common.policies.allocation.uniform import UniformAllocator  # noqa: F401
