"""engine = "sim" suites: what validates, and the hermes-sim arguments each kind of variant becomes."""

from __future__ import annotations

from pathlib import Path

import pytest

from hermes.common.config import build_config
from hermes.deploy.bench.runner import RunSpec, launch_sim, launch_testbed, plan
from hermes.deploy.bench.suites import SIM_RUN_TIMEOUT_S, SuiteError, build_suite, load_suite

REPO = Path(__file__).resolve().parents[2]
VARIANTS = [{"label": "bsp", "preset": "bsp"}, {"label": "hermes", "preset": "hermes"},
            {"label": "ddp", "preset": "bsp", "runner": "ddp", "overrides": {"lr": 0.1}},
            {"label": "ideal", "preset": "bsp", "homogeneous": True},
            {"label": "alone", "preset": "bsp", "runner": "alone"}]


def _suite(**fields):
    return build_suite({"name": "s", "engine": "sim", "variants": VARIANTS, **fields})


def _args(suite, label: str, link: str | None = None) -> list[str]:
    spec = next(s for s in plan(suite) if s.variant.label == label and (link is None or s.link == link))
    return spec.args(suite, Path("/tmp/x"))


def _value(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_sim_suites_take_populations_the_testbed_does_not():
    suite = _suite(profiles=["table2", "generated:offline=0", "hl8:nominal"], links=["own", "lte"], clients=12)
    assert suite.engine == "sim" and suite.run_timeout == SIM_RUN_TIMEOUT_S
    with pytest.raises(SuiteError, match="profiles"):
        build_suite({"name": "s", "variants": VARIANTS, "profiles": ["table2"]})
    with pytest.raises(SuiteError, match="links"):
        build_suite({"name": "s", "variants": VARIANTS, "links": ["own"]})
    with pytest.raises(SuiteError, match="profiles"):
        _suite(profiles=["phones"])
    with pytest.raises(SuiteError, match="churn"):
        _suite(churn="random:offline=0.2,mean_spell=5,seed=0")
    with pytest.raises(SuiteError, match="hooks"):
        _suite(variants=[{"label": "d", "preset": "bsp", "runner": "ddp", "ddp_hook": "fp16"}], baseline=None)


def test_each_variant_becomes_its_hermes_sim_arguments():
    suite = _suite(profiles=["table2"], links=["own", "lte"], clients=12, dataset="mnist1d", target_accuracy=0.9,
                   overrides={"num_samples": 20000})
    bsp = _args(suite, "bsp", "lte")
    assert (_value(bsp, "--population"), _value(bsp, "--devices"), _value(bsp, "--preset")) == ("table2", "12", "bsp")
    assert _value(bsp, "--link") == "lte" and _value(bsp, "--target-accuracy") == "0.9"
    assert _value(bsp, "--server-cost") == "calibrated" and "num_samples=20000" in bsp
    assert "--link" not in _args(suite, "bsp", "own")  # the population's own links
    assert "--alone" not in bsp and "--homogeneous" not in bsp and "--jitter" not in bsp
    jittery = _suite(jitter=0.3)
    assert _value(_args(jittery, "bsp"), "--jitter") == "0.3"
    assert plan(jittery)[0].identity(jittery)["jitter"] == 0.3 and "jitter" not in plan(suite)[0].identity(suite)

    # DDP: bsp with a barrier every mini-batch (one batch a cycle) and the variant's lr.
    ddp = _args(suite, "ddp", "lte")
    batch = build_config("bsp", dataset="mnist1d").batch_size
    assert _value(ddp, "--preset") == "bsp" and f"cycle_samples={batch}" in ddp and "lr=0.1" in ddp
    assert "--homogeneous" in _args(suite, "ideal", "lte")
    alone = _args(suite, "alone", "lte")
    assert "--alone" in alone and "--link" not in alone  # alone crosses no link


def test_identity_marks_sim_runs_so_testbed_results_are_never_reused():
    testbed = build_suite({"name": "s", "variants": VARIANTS[:1]})
    sim = _suite(variants=VARIANTS[:1])
    t, s = RunSpec(testbed.variants[0], "hl8", 0, 0), RunSpec(sim.variants[0], "hl8", 0, 0)
    assert "engine" not in t.identity(testbed)  # testbed runs finished before engine existed stay finished
    assert s.identity(sim)["engine"] == "sim" and s.identity(sim) != t.identity(testbed)
    assert t.args(testbed, Path("/tmp/x")) == t.testbed_args(testbed, Path("/tmp/x"))
    assert launch_sim is not launch_testbed


@pytest.mark.parametrize("name", ["sim-calibration-sim.toml", "sim-table3.toml"])
def test_the_shipped_sim_suites_load(name):
    suite = load_suite(REPO / "benchmarks" / "suites" / name)
    assert suite.engine == "sim" and suite.baseline == "bsp"
