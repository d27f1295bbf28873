"""Compatibility shim: the sync policies moved to ``hermes.common.policies.sync``; import from there."""

from hermes.common.policies.ebsp import ElasticBarrierStrategy, choose_barrier, predict_push_times  # noqa: F401
from hermes.common.policies.sync import (  # noqa: F401
    AsyncStrategy,
    BarrierStrategy,
    Decision,
    GatedAsyncStrategy,
    PushInfo,
    Release,
    StaleSynchronousStrategy,
    SyncStrategy,
    Verdict,
    _strategies,
    make_strategy,
)

SYNC_STRATEGIES = _strategies()
