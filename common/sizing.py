"""Compatibility shim: Hermes' straggler detection and sizing moved to ``hermes.common.policies.allocation.straggler``; import from there."""

from hermes.common.policies.allocation.cost_model import CostModel, constant_k_model, fit_cost_model  # noqa: F401
from hermes.common.policies.allocation.dual_search import SizingBounds, SizingResult, dual_binary_search  # noqa: F401
from hermes.common.policies.allocation.straggler import (  # noqa: F401
    IQR_FENCE,
    SearchConfig,
    StragglerSizer,
    iqr_bounds,
    iqr_outliers,
    quartiles,
)
