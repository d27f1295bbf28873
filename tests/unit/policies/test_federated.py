"""FedAsync (Xie, Koyejo, Gupta 2019): staleness functions and mixing weights, by hand."""

from __future__ import annotations

import math

import pytest

from hermes.common.config import ConfigError, build_config
from hermes.common.policies import base as registry
from hermes.common.policies.federated import FedAsync, FedAsyncParams, staleness_weight


def test_staleness_functions_of_section_5_2():
    assert staleness_weight("constant", 7, 0.5) == 1.0
    # polynomial (t - tau + 1)^-a, a = 0.5: 1 -> 2^-0.5, 3 -> 4^-0.5 = 0.5
    assert staleness_weight("polynomial", 1, 0.5) == pytest.approx(1 / math.sqrt(2))
    assert staleness_weight("polynomial", 3, 0.5) == pytest.approx(0.5)
    # hinge a = 10, b = 4: full weight up to 4, then 1 / (10 (t - tau - 4) + 1)
    assert staleness_weight("hinge", 4, 10, 4) == 1.0
    assert staleness_weight("hinge", 5, 10, 4) == pytest.approx(1 / 11)
    assert staleness_weight("hinge", 6, 10, 4) == pytest.approx(1 / 21)
    with pytest.raises(ValueError):
        staleness_weight("polynomial", -1, 0.5)


def test_mixing_weight_counts_a_fresh_update_as_t_minus_tau_1():
    rule = FedAsync(FedAsyncParams(alpha=0.6, staleness="polynomial", a=0.5))
    assert rule.mixing_weight(0) == pytest.approx(0.6 / math.sqrt(2))  # 0.424264
    assert rule.mixing_weight(2) == pytest.approx(0.3)  # t - tau = 3: 0.6 * 4^-0.5
    hinge = FedAsync(FedAsyncParams(alpha=0.9, staleness="hinge", a=10, b=4))
    assert hinge.mixing_weight(3) == pytest.approx(0.9)
    assert hinge.mixing_weight(4) == pytest.approx(0.9 / 11)


def test_mixing_replays_the_paper_update_rule():
    # x_t = (1 - alpha_t) x_{t-1} + alpha_t x_new, on scalars.
    rule = FedAsync(FedAsyncParams(alpha=0.5, staleness="constant"))
    x = 1.0
    for x_new in (3.0, 5.0):
        a = rule.mixing_weight(0)
        x = (1 - a) * x + a * x_new
    assert x == pytest.approx(3.5)  # 1 -> 2 -> 3.5


def test_preset_and_compatibility():
    cfg = build_config(preset="fedasync")
    assert (cfg.sync, cfg.aggregation, cfg.fedasync.alpha, cfg.fedasync.staleness) == ("asp", "fedasync", 0.6,
                                                                                       "polynomial")
    cls = registry.get("aggregation", "fedasync")
    assert cls.update_from_baseline and not cls.needs_candidate_loss
    with pytest.raises(ConfigError, match="fedasync"):
        build_config(preset="fedasync", sync="bsp")
    with pytest.raises(ConfigError, match="alpha"):
        build_config(preset="fedasync", **{"fedasync.alpha": 1.5})


# ---- FedBuff (Nguyen et al., AISTATS 2022) ----------------------------------------

def test_fedbuff_weights_by_hand():
    from hermes.common.policies.federated import fedbuff_weights

    # K = 4, eta_g = 1: s(tau) = 1/sqrt(1 + tau) -> 1, 1/sqrt(2), 1/2 (tau 3), 1/3 (tau 8); each over K.
    assert fedbuff_weights([0, 1, 3, 8], 1.0) == pytest.approx([0.25, 0.25 / math.sqrt(2), 0.125, 0.25 / 3])
    assert fedbuff_weights([0, 3], 2.0, "none") == pytest.approx([1.0, 1.0])  # eta_g / K each, unscaled
    with pytest.raises(ValueError):
        fedbuff_weights([], 1.0)


def test_fedbuff_buffer_releases_every_k_pushes_without_holding_anyone():
    from hermes.common.policies.federated import FedBuffer
    from hermes.common.policies.sync import Decision, PushInfo

    s = FedBuffer(buffer_size=3)
    for w in ("a", "b"):
        s.on_join(w)
    decisions = []
    for i, w in enumerate(("a", "a", "b", "a")):  # one worker may have several updates in the buffer
        decisions.append(s.on_push(PushInfo(w, 0, 0, 32, i + 1)).decision)
        release = s.take_release()
        if i == 2:
            assert release is not None and release.aggregate == () and release.wake == ()
        else:
            assert release is None
    assert decisions == [Decision.BUFFER_AND_REPLY] * 4


def test_fedbuff_preset_and_compatibility():
    cfg = build_config(preset="fedbuff")
    # FedBuff Sec. 5: K = 10; the few-agent variant keeps K = 2.
    assert (cfg.sync, cfg.aggregation, cfg.fedbuff.buffer_size, cfg.fedbuff.server_lr) == ("fedbuff", "fedbuff", 10, 1.0)
    assert build_config(preset="fedbuff-k2").fedbuff.buffer_size == 2
    with pytest.raises(ConfigError, match="fedbuff"):
        build_config(preset="fedbuff", sync="asp")
