"""Compatibility shim: moved to ``hermes.common.policies.allocation.pcontrol``."""

from hermes.common.policies.allocation.pcontrol import PControlAllocator  # noqa: F401
