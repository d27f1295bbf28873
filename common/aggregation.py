"""Compatibility shim: the aggregation rules moved to ``hermes.common.policies.aggregation``; import from there."""

from hermes.common.policies.aggregation import (  # noqa: F401
    aggregation_weights,
    batch_scaled_lr,
    loss_blend_weight,
    mean_weights,
    power_weights,
    sample_weights,
)
