"""Precision auto (chooser and measurement) and the usable-core count (fake cgroup files)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn

from hermes.client.cores import cgroup_quota, usable_cores
from hermes.client.precision import candidates, choose, measure, pick_precision
from hermes.common.builtin_task import classification_example


def test_choose_keeps_fp32_unless_another_is_clearly_faster():
    assert choose({"fp32": 10.0, "bf16": 29.0}) == "fp32"  # the 2-core EPYC case: bf16 2.9x slower
    assert choose({"fp32": 10.0, "bf16": 9.6}) == "fp32"  # 4% faster: within the margin
    assert choose({"fp32": 10.0, "bf16": 9.5}) == "bf16"  # exactly 5% faster
    assert choose({"fp32": 10.0, "bf16": 6.0, "fp16": 5.0}) == "fp16"  # the fastest of those that win
    assert choose({"fp32": 10.0, "fp16": math.inf, "bf16": 12.0}) == "fp32"  # non-finite loss: unsafe
    assert choose({"fp32": 10.0, "bf16": 9.0}, margin=0.2) == "fp32"
    assert choose({}) == "fp32"
    with pytest.raises(ValueError, match="margin"):
        choose({"fp32": 1.0}, margin=1.0)


def test_candidates_by_device():
    assert candidates(torch.device("cpu")) == ["fp32", "bf16"]


class _Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1))


def test_measure_times_copies_and_leaves_the_model_untouched():
    model = _Tiny()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    t = measure(model, classification_example((4,), 3), 8, torch.device("cpu"), ["fp32", "bf16"], budget_seconds=0.2)
    assert set(t) == {"fp32", "bf16"} and all(v > 0 for v in t.values())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


def test_pick_precision_forced_and_untimeable():
    assert pick_precision("bf16", _Tiny(), classification_example((4,), 3), 8, torch.device("cpu")).how == "forced"
    # Inputs of the wrong shape cannot be timed: fp32, the safe choice.
    choice = pick_precision("auto", _Tiny(), classification_example((5,), 3), 8, torch.device("cpu"))
    assert (choice.precision, choice.how) == ("fp32", "not timed")
    auto = pick_precision("auto", _Tiny(), classification_example((4,), 3), 8, torch.device("cpu"))
    assert auto.how == "measured" and auto.precision in ("fp32", "bf16") and set(auto.report()) == {"fp32", "bf16"}


def _fake(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


def test_cgroup_v2_quota_tightest_over_ancestors(tmp_path):
    root = _fake(tmp_path, {
        "proc/self/cgroup": "0::/kubepods/pod1/box\n",
        "sys/fs/cgroup/cpu.max": "max 100000\n",
        "sys/fs/cgroup/kubepods/pod1/cpu.max": "250000 100000\n",  # 2.5 CPUs on the pod
        "sys/fs/cgroup/kubepods/pod1/box/cpu.max": "max 100000\n",
    })
    assert cgroup_quota(root) == 2.5
    assert usable_cores(affinity=16, root=root).count == 3  # rounded up
    assert usable_cores(affinity=2, root=root).count == 2  # the affinity binds
    assert usable_cores(affinity=16, root=root).hints() == {"usable_cores": 3, "affinity_cores": 16, "cpu_quota": 2.5}


def test_cgroup_v2_unlimited_and_missing(tmp_path):
    root = _fake(tmp_path, {"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/cpu.max": "max 100000\n"})
    assert cgroup_quota(root) is None
    assert usable_cores(affinity=6, root=root).count == 6
    assert cgroup_quota(tmp_path / "nothing") is None


def test_cgroup_v1_quota(tmp_path):
    root = _fake(tmp_path, {
        "proc/self/cgroup": "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n",
        "sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "50000\n",
        "sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
        "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
        "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n",
    })
    assert cgroup_quota(root) == 0.5
    assert usable_cores(affinity=4, root=root).count == 1  # never below one


def test_cli_threads_default_is_auto(monkeypatch):
    from hermes.client.cli import build_parser

    monkeypatch.delenv("HERMES_THREADS", raising=False)
    assert build_parser().parse_args(["--server", "x"]).threads is None
    assert build_parser().parse_args(["--server", "x", "--threads", "3"]).threads == 3
    monkeypatch.setenv("HERMES_THREADS", "2")
    assert build_parser().parse_args(["--server", "x"]).threads == 2
