"""Issue 31's bench pieces: the edge suites build and run here, the alone and DDP-hook variants become the right
hermes-testbed arguments, and the PowerSGD byte count the DDP peer charges its link."""

from __future__ import annotations

from pathlib import Path

import pytest

from hermes.deploy.bench.runner import plan
from hermes.deploy.bench.suites import SuiteError, build_suite, builtin_suite, check_runnable
from hermes.deploy.ddp_rank import powersgd_bucket_bytes


@pytest.mark.parametrize("name,link", [("edge-lte", "lte"), ("edge-constrained", "constrained")])
def test_edge_suites_build_and_every_variant_runs_here(name: str, link: str) -> None:
    suite = builtin_suite(name)
    assert suite.model == "edge-resnet" and suite.dataset == "synthetic-cifar" and suite.links == (link,)
    assert check_runnable(suite) == []
    labels = {v.label for v in suite.variants}
    assert {"alone", "ddp-fp16", "ddp-powersgd-r1", "ddp-powersgd-r8", "bsp"} <= labels
    # The device-local variants hold their samples on the devices, as DDP's ranks do: no shard crosses the link.
    for label in ("hermes-ungated-local", "hermes-ungated-topk-local", "bsp-local"):
        overrides = next(v for v in suite.variants if v.label == label).overrides
        assert overrides["task"] == "hermes.deploy.bench.local_task:task", label


def test_the_hl2_suite_builds_and_its_other_devices_have_twice_the_fastest_compute() -> None:
    from hermes.deploy.profiles import worker_profiles

    suite = builtin_suite("hl2-alone")
    assert check_runnable(suite) == []
    speeds = sorted(wp.speed for wp in worker_profiles("hl2", suite.clients))
    assert sum(speeds[:-1]) >= 2 * speeds[-1]


def _args(label: str) -> list[str]:
    suite = builtin_suite("edge-lte")
    spec = next(s for s in plan(suite) if s.variant.label == label and s.repeat == 0)
    return spec.testbed_args(suite, Path("/tmp/x"))


def test_alone_is_one_ddp_rank_at_the_fastest_speed_without_a_link() -> None:
    args = _args("alone")
    assert args[args.index("--clients") + 1] == "1" and args[args.index("--profile") + 1] == "hl1"
    # hl8's fastest: slowdown 1, times the suite's pace (2), as the cluster's agents.
    assert "--peer" in args and "--link" not in args and args[args.index("--pace") + 1] == "2"
    assert args[args.index("--ddp-eval-every") + 1] == "5"


def test_the_suite_pace_slows_every_runner_alike() -> None:
    for label in ("bsp", "asp-topk", "ddp-powersgd-r4"):
        args = _args(label)
        assert args[args.index("--pace") + 1] == "2", label
    assert "--ddp-eval-every" not in _args("bsp")  # the server's own evaluation interval applies
    variants = [{"label": "alone", "preset": "bsp", "runner": "alone"}, {"label": "i", "preset": "bsp",
                                                                         "homogeneous": True}]
    suite = build_suite({"name": "x", "baseline": None, "profiles": ["hl8"], "clients": 4, "pace": 3.0,
                         "variants": variants})
    by = {s.variant.label: s.testbed_args(suite, Path("/tmp/x")) for s in plan(suite)}
    assert by["alone"][by["alone"].index("--pace") + 1] == "3"
    # The ideal cluster: the profile's sum of speeds (1.5 fastest) spread over 4, times the pace.
    assert float(by["i"][by["i"].index("--pace") + 1]) == pytest.approx(4 / 1.5 * 3)


def test_a_pace_below_one_is_refused() -> None:
    with pytest.raises(SuiteError, match="pace"):
        build_suite({"name": "x", "baseline": None, "pace": 0.5, "variants": [{"label": "b", "preset": "bsp"}]})


def test_ddp_hook_variants_pass_their_hook() -> None:
    args = _args("ddp-powersgd-r2")
    assert args[args.index("--ddp-hook") + 1] == "powersgd" and args[args.index("--ddp-powersgd-rank") + 1] == "2"
    assert "--ddp-hook" not in _args("ddp") and _args("ddp-fp16")[_args("ddp-fp16").index("--ddp-hook") + 1] == "fp16"


def test_an_unknown_hook_is_refused() -> None:
    with pytest.raises(SuiteError, match="ddp_hook"):
        build_suite({"name": "x", "baseline": None,
                     "variants": [{"label": "d", "preset": "bsp", "runner": "ddp", "ddp_hook": "int8"}]})


def test_powersgd_bucket_bytes() -> None:
    # 64x288 conv kernel at rank 4: (64 + 288) * 4 * 4 bytes; the bias (64) whole; a 4x4 matrix whole (not 2x smaller).
    assert powersgd_bucket_bytes([(64, 32, 3, 3), (64,), (4, 4)], 4) == 4 * ((64 + 288) * 4 + 64 + 16)
