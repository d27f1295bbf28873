"""Compatibility shim: the update gate moved to ``hermes.common.policies.gate``; import from there."""

from hermes.common.policies.gate import (  # noqa: F401
    REASONS,
    GateConfig,
    GateDecision,
    ZScoreGate,
    inclusive_z_bound,
    relaxed_alpha,
    window_zscore,
)
