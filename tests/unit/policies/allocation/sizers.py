"""The straggler sizer under the Hermes paper's rules, for the sizing tests."""

from __future__ import annotations

from hermes.common.policies.allocation._common import RebalanceParams
from hermes.common.policies.allocation.straggler import DualSearchParams, StragglerSizer


def paper_sizer(*, fit: str = "linear", balance_band: float = 0.0, min_observations: int = 2, warmup_cycles: int = 0,
                history: int = 20, **sizes: int) -> StragglerSizer:
    """The sizer under the paper's rules (IQR alone, no warm-up, K fitted from 20 cycles) unless told otherwise."""
    search = DualSearchParams(cost_fit=fit, balance_band=balance_band)  # type: ignore[arg-type]
    rebalance = RebalanceParams(min_observations=min_observations, warmup_cycles=warmup_cycles)
    return StragglerSizer(search, rebalance, history=history, **sizes)


def sizer(**cfg) -> StragglerSizer:
    return paper_sizer(**cfg, base_dss=256, base_batch_size=32, dss_step=64, dss_max=1437)
