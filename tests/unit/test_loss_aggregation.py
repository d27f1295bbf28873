"""Loss-weighted aggregation (Hermes Eq. 5-6, Alg. 2) with worked numbers."""

from __future__ import annotations

import math

import pytest
import torch

from hermes.common.aggregation import loss_blend_weight
from hermes.common.tensors import ModelSpec
from hermes.common.wire import Payload
from hermes.server.state import ModelState


def _payload(values, dtype=torch.float32) -> Payload:
    t = torch.tensor(values, dtype=dtype)
    return Payload(dtype=dtype, chunks=(t,), shapes=((t.numel(),),))


def _state(w0) -> ModelState:
    spec = ModelSpec(name="flat", entries=(("w", (len(w0),)),))
    return ModelState(spec, torch.tensor(w0, dtype=torch.float32))


def test_eq5_weights_worked_numbers():
    # T_g = 0.5, T_w = 0.25: W_global = 1/0.5 = 2, W_worker = 1/0.25 = 4, worker share 4/6.
    assert loss_blend_weight(0.5, 0.25) == pytest.approx(2 / 3)
    # Equal losses: plain average.
    assert loss_blend_weight(1.3, 1.3) == pytest.approx(0.5)
    # A worse worker model counts less: T_w = 3 T_g -> share 1/4.
    assert loss_blend_weight(0.2, 0.6) == pytest.approx(0.25)


def test_eq5_zero_loss_does_not_divide_by_zero():
    assert loss_blend_weight(0.5, 0.0) == pytest.approx(1.0)
    assert loss_blend_weight(0.0, 0.5) == pytest.approx(0.0, abs=1e-9)
    assert loss_blend_weight(0.0, 0.0) == pytest.approx(0.5)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -0.1])
def test_eq5_rejects_bad_losses(bad):
    with pytest.raises(ValueError, match="loss"):
        loss_blend_weight(bad, 0.3)
    with pytest.raises(ValueError, match="loss"):
        loss_blend_weight(0.3, bad)


def test_alg2_two_pushes_match_the_sigma_formulation():
    w0 = [1.0, 1.0]
    s = _state(w0)
    g1, g2 = [2.0, 0.0], [3.0, -3.0]
    # Alg. 2 initial step: sigma <- G1, w1 = w0 + G1 (eta folded into G).
    assert s.blend(_payload(g1), 1.0) == 1
    assert torch.equal(s.snapshot()[1], torch.tensor([3.0, 1.0]))
    # The worker model the second push describes: w_temp = w0 + G2 = [4, -2].
    assert torch.equal(s.candidate(_payload(g2)), torch.tensor([4.0, -2.0]))
    # Eq. 6 with T_g = 0.5, T_w = 0.25: sigma2 = (2*[2,0] + 4*[3,-3]) / 6 = [8/3, -2]; w2 = w0 + sigma2.
    weight = loss_blend_weight(0.5, 0.25)
    assert s.blend(_payload(g2), weight) == 2
    assert torch.allclose(s.snapshot()[1], torch.tensor([1 + 8 / 3, 1 - 2.0]), atol=1e-6)


def test_blend_accumulates_half_precision_updates_in_fp32():
    s = _state([0.0] * 4)
    g = [0.5, -0.25, 1.0, 2.0]
    s.blend(_payload(g, torch.bfloat16), 1.0)
    s.blend(_payload(g, torch.float16), 0.5)
    assert torch.equal(s.snapshot()[1], torch.tensor(g))
    assert s.snapshot()[1].dtype == torch.float32


def test_blend_weight_outside_unit_interval_refused():
    s = _state([0.0, 0.0])
    with pytest.raises(ValueError, match="blend weight"):
        s.blend(_payload([1.0, 1.0]), 1.5)
    assert s.version == 0
