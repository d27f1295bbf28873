"""Every preset's resolved config, against a snapshot made from the code before the policies took their own
sections (issue 26): moving defaults into one place per policy must not move any preset's effective value."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hermes.common.config import PRESETS, build_config

SNAPSHOT = json.loads((Path(__file__).parent / "data" / "presets_resolved.json").read_text())


def test_the_snapshot_covers_every_preset():
    assert sorted(SNAPSHOT) == sorted(PRESETS)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_a_presets_resolved_config_is_unchanged(name):
    assert build_config(name).model_dump(mode="json") == SNAPSHOT[name]


EFFECTIVE = json.loads((Path(__file__).parent / "data" / "presets_effective.json").read_text())
# The built policies' settings: each parameter object's values as the policy uses them.
CTL = ("b_min", "b_max", "deadband", "alpha", "global_batch", "global_rule", "drop_margin", "drop_cap_updates",
       "carry_smoothing", "deadband_order", "deadband_reference")
SEARCH = ("mbs_min", "mbs_max", "tolerance", "history", "fit", "min_observations", "balance_band", "warmup_cycles")
GATE = ("window", "alpha", "beta", "lam", "relaxation", "resync_factor", "alpha_reset", "current_in_window")


def _plain(v: object) -> object:
    return v if isinstance(v, (int, float, str, bool, type(None))) else repr(v)


def _effective(name: str) -> dict[str, object]:
    cfg = build_config(name)
    out: dict[str, object] = {}
    alloc = cfg.build_policy("allocation", dss_max=4096, epoch_samples=1024)
    out["allocation"] = type(alloc).__name__
    if hasattr(alloc, "ctl"):
        # The controller derives some settings (drop_margin ...) and reads the rest from its parameters.
        out["ctl"] = {k: _plain(getattr(alloc.ctl if hasattr(alloc.ctl, k) else alloc.ctl.params, k)) for k in CTL}
    if hasattr(alloc, "sizer"):
        # The sizer's settings, under the names the snapshot (the old SearchConfig) gave them.
        sizer = alloc.sizer
        values = {**sizer.search.model_dump(), **sizer.rebalance_params.model_dump(), "history": sizer.history,
                  "fit": sizer.search.cost_fit}
        out["search"] = {k: _plain(values[k]) for k in SEARCH}
    out["allocator_state"] = alloc.state_dict()
    gate = cfg.build_policy("gate")
    out["gate"] = None if gate is None else {k: _plain(getattr(gate.config, k)) for k in GATE}
    sync = cfg.build_policy("sync")
    out["sync"] = [type(sync).__name__, {k: _plain(v) for k, v in sorted(vars(sync).items())}]
    return out


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_a_presets_built_policies_keep_their_effective_values(name):
    assert json.loads(json.dumps(_effective(name), default=repr)) == EFFECTIVE[name]
