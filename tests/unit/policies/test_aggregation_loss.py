"""Loss-weighted aggregation (Hermes Eq. 5-6, Alg. 2) with worked numbers."""

from __future__ import annotations

import math

import pytest
import torch

from hermes.common.policies.aggregation import loss_blend_weight
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


def test_sharpness_raises_the_eq5_inverse_losses_to_a_power():
    # p = 1 is Eq. 6 itself; p = 2 squares the inverse losses: W_global = 1/0.5^2 = 4,
    # W_worker = 1/0.25^2 = 16, worker share 16/20.
    assert loss_blend_weight(0.5, 0.25, sharpness=1.0) == loss_blend_weight(0.5, 0.25)
    assert loss_blend_weight(0.5, 0.25, sharpness=2.0) == pytest.approx(0.8)
    # A stale delta that makes the model worse (from a measured run: T_g 0.395, T_w 0.9215):
    # Eq. 6 still adds 30% of it; p = 2 adds 16%, p = 4 3%.
    assert loss_blend_weight(0.395, 0.9215) == pytest.approx(0.300, abs=1e-3)
    assert loss_blend_weight(0.395, 0.9215, sharpness=2.0) == pytest.approx(0.155, abs=1e-3)
    assert loss_blend_weight(0.395, 0.9215, sharpness=4.0) == pytest.approx(0.0326, abs=1e-3)
    # Equal losses stay a plain average whatever p.
    assert loss_blend_weight(1.3, 1.3, sharpness=4.0) == pytest.approx(0.5)
    assert loss_blend_weight(0.0, 0.0, sharpness=2.0) == pytest.approx(0.5)
    # A finite but huge ratio neither overflows nor leaves [0, 1].
    assert loss_blend_weight(1e-3, 1e300, sharpness=8.0) == 0.0
    assert loss_blend_weight(1e300, 1e-3, sharpness=8.0) == 1.0


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


# ---- loss.reference = "pull" (a deviation: since-pull deltas added, not worker models blended)

def test_candidate_from_current_is_current_model_plus_delta():
    s = _state([1.0, 1.0])
    s.apply([(_payload([2.0, 0.0]), 1.0)])  # w = [3, 1]
    # From baseline (the paper's w_temp): w0 + G; from current: w + delta.
    assert torch.equal(s.candidate(_payload([1.0, -1.0])), torch.tensor([2.0, 0.0]))
    assert torch.equal(s.candidate(_payload([1.0, -1.0]), from_current=True), torch.tensor([4.0, 0.0]))
    assert torch.equal(s.snapshot()[1], torch.tensor([3.0, 1.0]))  # scoring leaves the model alone


class _FixedProbe:
    """A loss probe whose global and candidate losses are given (the LossProbe interface)."""

    def __init__(self, global_loss: float, candidate_loss: float) -> None:
        self.losses = (global_loss, candidate_loss)
        self.from_current: list[bool] = []

    def global_loss(self) -> tuple[int, float]:
        return 1, self.losses[0]

    def candidate_loss(self, payload, *, from_current: bool = False) -> float:
        self.from_current.append(from_current)
        return self.losses[1]


def _fold(reference: str, version: int, server_lr: float = 1.0,
          sharpness: float = 1.0) -> tuple[object, list[float], _FixedProbe]:
    import asyncio
    from types import SimpleNamespace

    from hermes.common.policies.aggregation import LossParams, LossWeighted
    from hermes.server.engine.policies import Contribution, RuleFold
    from hermes.server.metrics import ServerMetrics

    probe = _FixedProbe(0.5, 0.25)
    params = LossParams(reference=reference, server_lr=server_lr, sharpness=sharpness)
    rule = RuleFold(LossWeighted(params), probe=probe, metrics=ServerMetrics(), power_of=None)  # type: ignore[arg-type]

    async def go() -> list[float]:
        loss = await rule.candidate_loss(_payload([1.0]))
        info = SimpleNamespace(samples=32, staleness=0, worker_id="w")
        weights, _ = await rule.weigh([Contribution(info=info, payload=_payload([1.0]), candidate_loss=loss)],  # type: ignore[arg-type]
                                      SimpleNamespace(version=version))  # type: ignore[arg-type]
        return weights

    return rule, asyncio.run(go()), probe


def test_pull_reference_adds_the_delta_with_the_eq5_share():
    rule, weights, probe = _fold("pull", version=3)
    assert rule.op == "apply"  # the engine folds w <- w + a * delta
    assert probe.from_current == [True]  # the candidate is w + delta
    assert weights == [pytest.approx(2 / 3)]  # Eq. 5-6: T_g / (T_g + T_w) with 0.5, 0.25
    s = _state([1.0, 1.0])
    s.apply([(_payload([3.0, -3.0]), weights[0])])
    assert torch.allclose(s.snapshot()[1], torch.tensor([3.0, -1.0]))


def test_baseline_reference_is_the_papers_blend():
    rule, weights, probe = _fold("baseline", version=3)
    assert rule.op == "blend" and probe.from_current == [False]
    assert weights == [pytest.approx(2 / 3)]
    # The first push becomes the model whole (Alg. 2 initial step), under either reference.
    assert _fold("pull", version=0)[1] == [1.0]


def test_agents_push_since_pull_only_under_the_pull_reference():
    from hermes.common.config import build_config
    from hermes.common.policies import base as registry

    rule = registry.get("aggregation", "loss")
    assert build_config(preset="hermes-paper").loss.reference == "baseline"  # the paper's, the policy's default
    assert rule.pushes_from_baseline(loss=build_config(preset="hermes-paper").loss) is True
    assert rule.pushes_from_baseline(loss=build_config(preset="hermes").loss) is False
    assert build_config(preset="hermes-paper").pushes_from_baseline() is True
    assert build_config(preset="hermes").pushes_from_baseline() is False
    assert registry.get("aggregation", "fedasync").pushes_from_baseline() is True
    assert build_config(preset="fedasync").pushes_from_baseline() is True


def test_pull_reference_server_lr_scales_the_share():
    assert _fold("pull", version=3, server_lr=2.0)[1] == [pytest.approx(4 / 3)]  # 2 x 2/3
    assert _fold("pull", version=0, server_lr=2.0)[1] == [1.0]  # the first push is the model, not 2x it


def test_the_fold_takes_the_sharpened_share():
    assert _fold("pull", version=3, sharpness=2.0)[1] == [pytest.approx(0.8)]  # 0.5^-2 / (0.5^-2 + 0.25^-2)
    assert _fold("baseline", version=3, sharpness=2.0)[1] == [pytest.approx(0.8)]
    assert _fold("pull", version=0, sharpness=2.0)[1] == [1.0]


def test_server_lr_needs_the_pull_reference():
    from hermes.common.config import ConfigError, build_config

    with pytest.raises(ConfigError, match="server_lr"):
        build_config(preset="hermes-paper", **{"loss.server_lr": 2.0})
    assert build_config(preset="hermes-paper", **{"loss.reference": "pull", "loss.server_lr": 2.0}).loss.server_lr == 2.0


def test_hermes_differs_from_the_paper_preset_only_by_the_measured_deviations():
    from hermes.common.config import build_config

    paper, fast = build_config(preset="hermes-paper").model_dump(), build_config(preset="hermes").model_dump()
    differ = {k for k in paper if paper[k] != fast[k]}
    # Every difference is a deviation row (tests/unit/policies/test_paper_fidelity.py checks each switch),
    # except concurrency.turn_ends, which acts only under a concurrency.limit, a bound the paper has not.
    assert differ == {"preset", "momentum", "loss", "overlap_push", "zscore", "early_stop", "combine_messages",
                      "assignments_per_request", "dual_search", "rebalance", "concurrency"}
    assert {k for k in paper["concurrency"] if paper["concurrency"][k] != fast["concurrency"][k]} == {"turn_ends"}
    assert paper["concurrency"]["limit"] == fast["concurrency"]["limit"] == 0
    assert (paper["zscore"]["resync_factor"], fast["zscore"]["resync_factor"]) == (None, 4.0)
    assert (paper["zscore"]["validation_samples"], fast["zscore"]["validation_samples"]) == (256, 128)
    assert {k for k in paper["zscore"] if paper["zscore"][k] != fast["zscore"][k]} == {
        "resync_factor", "validation_samples", "relaxation", "alpha_reset", "current_in_window"}
    assert (paper["lr"], paper["momentum"], paper["loss"]["reference"]) == (0.1, 0.0, "baseline")  # Table I, Alg. 2
    assert (paper["overlap_push"], fast["overlap_push"]) == (False, True)
    assert fast["loss"]["reference"] == "pull" and fast["loss"]["server_lr"] == 1.0 and fast["momentum"] == 0.9
    assert (paper["loss"]["eval_samples"], fast["loss"]["eval_samples"]) == (512, 256)
    assert (paper["loss"]["sharpness"], fast["loss"]["sharpness"]) == (1.0, 2.0)
    assert {k for k in paper["loss"] if paper["loss"][k] != fast["loss"][k]} == {"reference", "eval_samples",
                                                                               "sharpness", "concurrency_scale",
                                                                               "bn_stats"}
    assert (paper["loss"]["bn_stats"], fast["loss"]["bn_stats"]) == ("fold", "recalibrate")
