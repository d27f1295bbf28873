"""Data in the simulator: the server's shards, IID and Dirichlet splits, and the task's own local_data."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from hermes.common.config import build_config
from hermes.common.datasets import load_dataset
from hermes.common.task_registry import resolve_task
from hermes.sim.cli import main
from hermes.sim.data import SHARDS, Split, SplitError, parse_split
from hermes.sim.devices import ALWAYS_ON, DeviceProfile
from hermes.sim.links import transfer_seconds
from hermes.sim.run import SimError, Simulation, deterministic_view


def _devices(n: int = 4) -> list[DeviceProfile]:
    return [DeviceProfile(f"d-{i}", "test", 2e8 / (1 + i), memory_mb=4096.0, up_mbps=1000.0, down_mbps=1000.0,
                          rtt_s=0.0002, availability=ALWAYS_ON) for i in range(n)]


def _run(tmp_path, name: str, *, split=None, preset: str = "asp", task=None, n: int = 4, **config):
    cfg = build_config(preset, dataset="digits", model="mlp", **{"seed": 0, "max_updates": 40, **config})
    sim = Simulation(cfg, _devices(n), out=tmp_path / name, task=task, transfer=transfer_seconds, split=split)
    return sim.run()


@pytest.mark.parametrize("text, split", [
    (None, SHARDS), ("shards", SHARDS), ("iid", Split("iid")), ("dirichlet:0.5", Split("dirichlet", 0.5)),
    ("dirichlet:1e-2", Split("dirichlet", 0.01)),
])
def test_split_names_parse(text, split):
    assert parse_split(text) == split
    assert parse_split(str(split)) == split


@pytest.mark.parametrize("text", ["dirichlet", "dirichlet:x", "dirichlet:0", "dirichlet:-1", "dirichlet:inf",
                                  "iid:3", "noniid", ""])
def test_bad_split_names_are_one_clear_error(text):
    with pytest.raises(SplitError, match="split"):
        parse_split(text)


def _dominant_share(summary) -> float:
    shares = [max(w["data"]["labels"]) / w["data"]["samples"] for w in summary["workers"]]
    return float(np.mean(shares))


def test_a_dirichlet_split_skews_what_each_device_holds_and_the_server_sizes_the_cycles(tmp_path):
    skewed = _run(tmp_path, "skewed", split="dirichlet:0.05", n=8)
    iid_like = _run(tmp_path, "flat", split="dirichlet:1000", n=8)
    assert skewed["data"] == {"split": "dirichlet:0.05", "source": "local", "train_samples": iid_like["data"]["train_samples"]}
    # Hsu et al. 2019 Sec. 3: alpha -> 0, one class per device; alpha -> inf, the data set's own mix (10 classes).
    assert _dominant_share(skewed) > 0.6 > 0.25 > _dominant_share(iid_like)
    held = [w["data"]["samples"] for w in skewed["workers"]]
    assert sum(held) == skewed["data"]["train_samples"] and max(held) - min(held) <= 1
    # The devices trained on their own data: the server dealt sample counts, no shard.
    events = [json.loads(line) for line in (tmp_path / "skewed" / "events.jsonl").read_text().splitlines()]
    assignments = [e for e in events if e["event"] == "assignment"]
    assert assignments and all(e["shards"] == [] and e["local_samples"] == e["dss"] for e in assignments)
    assert all(w["device"]["cycles"] > 0 for w in skewed["workers"])
    assert skewed["model_updates"] == 40


def test_a_split_run_is_the_same_for_the_same_seed_and_another_for_another(tmp_path):
    a = _run(tmp_path, "a", split="dirichlet:0.3")
    b = _run(tmp_path, "b", split="dirichlet:0.3")
    assert deterministic_view(a) == deterministic_view(b)
    c = _run(tmp_path, "c", split="dirichlet:0.3", seed=1)
    assert [w["data"] for w in c["workers"]] != [w["data"] for w in a["workers"]]


def test_an_iid_split_gives_every_device_an_equal_share(tmp_path):
    s = _run(tmp_path, "iid", split="iid")
    held = [w["data"]["samples"] for w in s["workers"]]
    assert s["data"]["split"] == "iid" and max(held) - min(held) <= 1 and "labels" not in s["workers"][0]["data"]
    assert s["model_updates"] == 40


def test_the_default_is_the_servers_shards(tmp_path):
    s = _run(tmp_path, "shards")
    assert s["data"] == {"split": "shards", "source": "server"} and "data" not in s["workers"][0]


def test_the_tasks_own_local_data_is_what_each_device_trains_on(tmp_path):
    cfg = build_config("asp", dataset="digits", model="mlp")
    base = resolve_task("builtin", cfg)
    train, _ = load_dataset("digits")
    # Device d-i holds the classes i and i + 4 only (one class for the other two); train_data is gone.
    asked: list[str] = []

    def local_data(name: str):
        asked.append(name)
        k = int(name.split("-")[1])
        keep = np.flatnonzero((train.y == k) | (train.y == k + 4))
        return train.x[keep], train.y[keep]

    task = dataclasses.replace(base, train_data=None, local_data=local_data)
    s = _run(tmp_path, "own", task=task)
    assert s["data"] == {"split": "task local_data", "source": "local"}
    assert sorted(set(asked)) == [f"d-{i}" for i in range(4)]
    assert all(w["device"]["cycles"] > 0 for w in s["workers"]) and s["model_updates"] == 40
    with pytest.raises(SimError, match="own local_data"):
        _run(tmp_path, "both", task=task, split="iid")


def test_a_preset_that_deals_the_servers_train_set_is_refused_with_a_split(tmp_path):
    with pytest.raises(SimError, match="cannot train on device-local data"):
        _run(tmp_path, "dp", split="iid", preset="dp-sgd")


def test_the_cli_takes_the_split_and_refuses_a_bad_one_in_one_line(tmp_path, capsys):
    argv = ["--dataset", "digits", "--model", "mlp", "--preset", "asp", "--set", "max_updates=10",
            "--server-cost", "none", "--quiet"]
    assert main([*argv, "--split", "dirichlet:0.5", "--out", str(tmp_path / "ok")]) == 0
    assert json.loads((tmp_path / "ok" / "summary.json").read_text())["data"]["split"] == "dirichlet:0.5"
    assert main([*argv, "--split", "dirichlet:zero", "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err.strip()
    assert "dirichlet needs an alpha" in err and len(err.splitlines()) == 1
