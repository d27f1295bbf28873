"""Compatibility shim: moved to ``hermes.common.policies.allocation.static``."""

from hermes.common.policies.allocation.static import StaticAllocator  # noqa: F401
