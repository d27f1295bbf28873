"""Compatibility shim: moved to ``hermes.common.policies.allocation.hermes_sizing``."""

from hermes.common.policies.allocation.hermes_sizing import DualSearchAllocator  # noqa: F401
