"""Training on Ray gives the same run as training here: a small simulation on a local Ray instance.

Skipped where Ray is not installed (it is the optional extra hermes-edge[ray], not a test dependency:
see docs/simulation.md "Ray"). The executors' own contract (same inputs, same bits) is tested without Ray.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import sys

import numpy as np
import pytest
import torch

from hermes.common.config import build_config
from hermes.common.task_registry import resolve_task
from hermes.common.tensors import flatten, spec_of
from hermes.sim.cli import main
from hermes.sim.devices import ALWAYS_ON, DeviceProfile, IntervalAvailability
from hermes.sim.executor import CycleInputs, LocalExecutor, build_trainer, run_cycle
from hermes.sim.links import transfer_seconds
from hermes.sim.run import Simulation, deterministic_view

HAS_RAY = importlib.util.find_spec("ray") is not None


def _devices(n: int = 4) -> list[DeviceProfile]:
    # Speeds 1, 1/2, 1/3, 1/4: cycles of different lengths overlap in virtual time.
    return [DeviceProfile(f"d-{i}", "test", 2e8 / (1 + i), memory_mb=4096.0, up_mbps=1000.0, down_mbps=1000.0,
                          rtt_s=0.0002, availability=ALWAYS_ON) for i in range(n)]


def _config(preset: str, **kw):
    return build_config(preset, dataset="digits", model="mlp", **{"seed": 0, "max_updates": 30, **kw})


def _inputs(trainer, seed: int = 0, momentum_state=None) -> CycleInputs:
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(96, 64, generator=g), torch.randint(0, 10, (96,), generator=g)
    return CycleInputs(weights=flatten(trainer.model).clone(), opt_state=momentum_state,
                       rng_state=np.random.default_rng(seed).bit_generator.state, global_steps=0, anchor=None,
                       x=x, y=y, lr=0.05, batch_size=16, accumulation=1)


def test_a_cycle_depends_on_its_inputs_alone_not_on_the_trainer_it_ran_on():
    cfg = _config("asp", momentum=0.9)
    task = resolve_task("builtin", cfg)
    spec = spec_of(task.model(), "mlp")
    trainers = [build_trainer(task, cfg, spec) for _ in range(2)]
    inputs = _inputs(trainers[0])
    first = run_cycle(trainers[0], inputs)
    # Another trainer that trained something else before: the same inputs give the same bits.
    run_cycle(trainers[1], _inputs(trainers[1], seed=5))
    executor = LocalExecutor(trainers[1])
    again = executor.result(executor.submit(inputs))
    assert torch.equal(first.weights, again.weights) and first.rng_state == again.rng_state
    assert first.opt_state is not None and again.opt_state is not None
    assert all(torch.equal(first.opt_state[i]["momentum_buffer"], again.opt_state[i]["momentum_buffer"])
               for i in first.opt_state)
    assert first.result.loss == again.result.loss and first.result.samples == 96


def test_a_run_on_a_local_ray_instance_gives_the_same_summary_as_a_local_run(tmp_path):
    """One test (one Ray instance, one pytest-xdist worker): hermes (the gate), fedasync (the proximal
    term), asp with momentum on a Dirichlet split and a device that leaves mid-cycle."""
    if not HAS_RAY:
        pytest.skip("Ray is not installed (the optional extra: pip install 'hermes-edge[ray]')")
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        for preset, extra in (("hermes", {}), ("fedasync", {}), ("asp", {"momentum": 0.9})):
            _same_here_and_on_ray(tmp_path / preset, preset, extra)
        assert ray.is_initialized()  # the caller's instance: the simulation left it running
    finally:
        ray.shutdown()


def _same_here_and_on_ray(out, preset: str, extra: dict) -> None:
    devices = _devices()
    if preset == "asp":
        # The fastest device leaves from 0.2 to 0.6 virtual s: the cycle it was training is lost on Ray too.
        devices[0] = dataclasses.replace(devices[0], availability=IntervalAvailability(((0.0, 0.2), (0.6, math.inf))))
    runs = {}
    for where in ("here", "ray"):
        sim = Simulation(_config(preset, **extra), devices, out=out / where, transfer=transfer_seconds,
                         split="dirichlet:0.5" if preset == "asp" else None,
                         ray="auto" if where == "ray" else None)
        runs[where] = (sim, sim.run())
    here, ray_run = runs["here"][1], runs["ray"][1]
    assert deterministic_view(here) == deterministic_view(ray_run), preset
    assert here["model_updates"] == 30 and all(w["device"]["cycles"] > 0 for w in here["workers"])
    if preset == "asp":
        assert (here["workers"][0]["device"]["offline"], here["workers"][0]["device"]["lost_cycles"]) == (1, 1)
    # Every cycle went to Ray.
    cycles = sum(w["device"]["cycles"] for w in ray_run["workers"])
    assert runs["ray"][0].executor.submitted >= cycles > 0


def test_ray_missing_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # find_spec("ray") raises ValueError on a None entry
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    assert main(["--ray", "auto", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "hermes-sim: --ray needs Ray: pip install 'hermes-edge[ray]'"
    assert not (tmp_path / "x").exists()
