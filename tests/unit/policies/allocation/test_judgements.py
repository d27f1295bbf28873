"""dual_search.judgements_per_round: the cluster is judged a fixed number of times per round of reports."""

from __future__ import annotations

import pytest

from hermes.common.config import build_config
from hermes.common.policies.allocation import CycleObservation


@pytest.mark.parametrize(("workers", "per_round", "want"), [
    (12, 8, 12),  # Hermes' 12 workers: at every report, as the paper
    (64, 8, 8),  # one judgement each 64 // 8 = 8 reports
    (1000, 8, 8),  # each 125
    (64, 0, 64),  # the paper's rule at any size
])
def test_a_round_of_reports_is_judged_judgements_per_round_times(workers, per_round, want):
    cfg = build_config("hermes", **{"dual_search.judgements_per_round": per_round})
    alloc = cfg.build_policy("allocation", dss_max=4096, epoch_samples=4096)
    for i in range(workers):
        alloc.observe(f"w{i:04d}", CycleObservation(128, 32, 1.0))
    judged = []
    judge = alloc.sizer.rebalance
    alloc.sizer.rebalance = lambda: judged.append(1) or judge()
    for i in range(workers):  # a round: each worker reports once, the engine asks after each report
        alloc.observe(f"w{i:04d}", CycleObservation(128, 32, 1.0))
        alloc.rebalance()
    assert len(judged) == want
