"""The memory model for batch bounds (OmniLearn Eq. 9): fit and bound."""

from __future__ import annotations

import pytest

from hermes.common.policies.allocation.memory_model import fit_memory_model, max_batch_for_memory
from hermes.common.policies.allocation.proportional_control import PControlParams, ProportionalController


def controller(batches: dict[str, int], *, b_min: int = 1, b_max: int = 1 << 30, global_batch: int | None = None,
               **settings: object) -> ProportionalController:
    """The controller under the papers' rules (no drop margin, smoothing restarts, caps never lifted) unless
    ``settings`` (``pcontrol`` fields) say otherwise; bounds as wide as the test needs."""
    paper: dict[str, object] = {"carry_smoothing": False, "drop_margin": 0.0, "drop_cap_updates": 0}
    return ProportionalController(batches, PControlParams(**(paper | settings)), b_min=b_min, b_max=b_max,
                                  global_batch=global_batch)


def test_memory_model_fit_and_bound():
    # OmniLearn Eq. 9 / Fig. 6: memory = 1 GiB fixed + 3 MiB per sample (batches as in Fig. 6a).
    m0_true, m1_true = 2**30, 3 * 2**20
    samples = [(b, m0_true + m1_true * b) for b in (1, 32, 64, 128, 512, 1024)]
    m0, m1 = fit_memory_model(samples)
    assert m0 == pytest.approx(m0_true, rel=1e-9) and m1 == pytest.approx(m1_true, rel=1e-9)
    # 2 GiB budget: (2^31 - 2^30) / (3 * 2^20) = 341.33 -> 341.
    assert max_batch_for_memory(m0, m1, 2**31) == 341
    c = controller({"a": 32}, b_min=4, b_max=1024)
    c.set_b_max("a", max_batch_for_memory(m0, m1, 2**31))
    assert c.b_max_of("a") == 341
    with pytest.raises(ValueError, match="does not fit"):
        max_batch_for_memory(m0, m1, m0)
    with pytest.raises(ValueError, match="two or more"):
        fit_memory_model([(32, 1.0), (32, 2.0)])
