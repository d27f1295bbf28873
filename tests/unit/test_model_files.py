"""The run's model files are standard state_dicts: two lines load them, with safetensors' own reader."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from hermes.common.clock import ManualClock
from hermes.common.tensors import ModelSpec, flatten
from hermes.server.model_files import standard_state_dict, write_model
from tests.unit.test_engine_inprocess import _engine

safetensors_torch = pytest.importorskip("safetensors.torch")


def _net() -> nn.Module:
    torch.manual_seed(0)
    # BatchNorm: float running stats that travel, an int64 counter that does not.
    return nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 3))


def test_a_written_model_loads_into_a_fresh_module_in_two_lines(tmp_path):
    trained = _net()
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(1.5)
    trained.train()(torch.randn(8, 4))  # moves the running stats and counts a batch
    template = _net().state_dict()
    path = tmp_path / "model.safetensors"
    assert write_model(path, template, flatten(trained), {"version": "7"})

    fresh = _net()
    fresh.load_state_dict(safetensors_torch.load_file(path))  # strict: every key, nothing else
    for (k, want), (k2, got) in zip(trained.state_dict().items(), fresh.state_dict().items(), strict=True):
        assert k == k2
        if want.is_floating_point():
            assert torch.equal(want, got), k
    # The counter never travels: it is the initial model's.
    assert int(fresh.state_dict()["1.num_batches_tracked"]) == 0
    assert safetensors_torch.load_file(path)["1.num_batches_tracked"].dtype == torch.int64


def test_a_flat_model_of_the_wrong_size_is_refused():
    template = _net().state_dict()
    flat = flatten(_net())
    with pytest.raises(ValueError, match="elements"):
        standard_state_dict(template, flat[:-1])
    with pytest.raises(ValueError, match="elements"):
        standard_state_dict(template, torch.cat([flat, flat[:1]]))


def test_the_engine_writes_final_and_best_models_at_the_end(tmp_path):
    engine = _engine(ManualClock(), out_dir=str(tmp_path))
    engine.evaluator.evaluate_now()
    summary = engine.reporting.finish()
    assert summary["final_model_file"] == "model-final.safetensors"
    assert summary["best_model_file"] == "model-best.safetensors"
    _, flat = engine.state.snapshot()
    for name in ("model-final.safetensors", "model-best.safetensors"):
        with safetensors_torch.safe_open(str(tmp_path / name), "pt") as f:
            meta = f.metadata()
        assert ModelSpec.from_dict(json.loads(meta["spec"])).numel == flat.numel()
        model = engine.task.model()
        model.load_state_dict(safetensors_torch.load_file(tmp_path / name))
        assert torch.equal(flatten(model), flat) and int(meta["version"]) == engine.state.version
        assert float(meta["accuracy"]) == summary["final_accuracy"]
