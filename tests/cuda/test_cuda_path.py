"""The CUDA path: fp16 autocast with loss scaling, the measured precision, and a testbed run on a GPU.

Skipped where torch sees no CUDA device (CI, this project's CPU machines);
run on a GPU machine with ``pytest tests/cuda``.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch

from hermes.client.precision import candidates, pick_precision
from hermes.client.trainer import LocalTrainer
from hermes.common.builtin_task import classification_example
from hermes.common.datasets import load_dataset
from hermes.common.models import build_model
from tests.conftest import run_testbed

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

CUDA = torch.device("cuda")


def _digits() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x, y) of the built-in digits' train split, then of its test split."""
    train, test = load_dataset("digits")
    return (torch.from_numpy(train.x), torch.from_numpy(train.y), torch.from_numpy(test.x),
            torch.from_numpy(test.y))


def _trainer(precision: str, seed: int = 0) -> LocalTrainer:
    torch.manual_seed(seed)
    model = build_model("cnn", input_shape=(1, 8, 8), num_classes=10)
    return LocalTrainer(model, lr=0.1, momentum=0.9, device=CUDA, precision=precision, seed=seed)


def test_fp16_training_uses_the_loss_scaler_learns_and_keeps_fp32_weights() -> None:
    x, y, x_test, y_test = _digits()
    trainer = _trainer("fp16")
    assert trainer.scaler.is_enabled()
    first = trainer.train_cycle(x[:1024], y[:1024], 32)
    for _ in range(4):
        last = trainer.train_cycle(x[:1024], y[:1024], 32)
    assert math.isfinite(first.loss) and last.loss < 0.5 * first.loss, (first.loss, last.loss)
    # Autocast computes in fp16; the master weights (what is pushed) stay fp32.
    assert all(p.dtype == torch.float32 and p.is_cuda for p in trainer.model.parameters())
    flat = trainer.flat()
    assert flat.device.type == "cpu" and flat.dtype == torch.float32 and bool(torch.isfinite(flat).all())
    # Held-out loss through the gate's evaluate path, on the GPU.
    assert trainer.evaluate(x_test, y_test) < 1.0


def test_an_overflowing_fp16_step_is_skipped_and_the_scale_backs_off() -> None:
    x, y, _, _ = _digits()
    trainer = _trainer("fp16")
    # A scale this large overflows fp16 gradients: the scaler must skip the step, not apply inf.
    trainer.scaler = torch.amp.GradScaler("cuda", init_scale=2.0**60)
    before = trainer.flat()
    trainer.train_cycle(x[:32], y[:32], 32, steps=1)
    after = trainer.flat()
    assert torch.equal(before, after)
    assert trainer.scaler.get_scale() < 2.0**60
    # Once the scale has backed off, steps are taken again.
    for _ in range(80):
        trainer.train_cycle(x[:32], y[:32], 32, steps=1)
    assert not torch.equal(after, trainer.flat()) and bool(torch.isfinite(trainer.flat()).all())


def test_a_pulled_model_loads_onto_the_gpu() -> None:
    trainer = _trainer("fp32")
    other = _trainer("fp32", seed=1).flat()
    trainer.load(other)
    assert torch.equal(trainer.flat(), other)


@pytest.mark.parametrize(("model", "shape"), [("cnn", (1, 8, 8)), ("cnn", (1, 40)), ("resnet18", (3, 32, 32))])
def test_auto_times_every_cuda_precision_and_is_never_slower_than_fp32(model: str, shape: tuple[int, ...],
                                                                         tmp_path: Path) -> None:
    torch.manual_seed(0)
    net = build_model(model, input_shape=shape, num_classes=10)
    choice = pick_precision("auto", net, classification_example(shape, 10), 32, CUDA,
                            cache=tmp_path / "precision.json")
    assert set(choice.timings) == set(candidates(CUDA)) >= {"fp32", "fp16"}
    assert all(math.isfinite(t) and t > 0 for t in choice.timings.values()), choice.describe()
    assert choice.timings[choice.precision] <= choice.timings["fp32"], choice.describe()
    print(model, shape, choice.describe())


@pytest.mark.parametrize("preset", ["hermes", "bsp"])
def test_a_testbed_of_gpu_agents_reaches_its_target(preset: str, tmp_path: Path) -> None:
    out = tmp_path / preset
    # Every agent measures its precisions: none reuses a cached choice of an earlier test.
    run_testbed(out, "--device", "cuda", "--clients", "3", "--profile", "hl4", "--preset", preset,
                "--target-accuracy", "0.9", "--quiet", timeout=300,
                env={**os.environ, "HERMES_PRECISION_CACHE": "off"})
    summary = json.loads((out / "server_summary.json").read_text())
    assert summary["outcome"] == "target_reached", summary["stop_reason"]
    workers = summary["workers"]
    assert len(workers) == 3 and all(w["device"].startswith("cuda") for w in workers)
    for w in workers:
        timings = w["precision_timings_ms"]
        print(w["name"], w["precision"], timings)
        assert w["precision"] in timings and "fp16" in timings
        # Timed in a fresh process: kernel loading must not count as step time (it made
        # fp16 and bf16 look 200-300x slower than fp32 on an H100).
        assert max(timings.values()) < 10 * min(timings.values()), timings


def test_the_edge_model_trains_under_fp16_autocast_and_keeps_its_batchnorm_statistics_finite() -> None:
    """Wave 3's edge-sized model (issue 31) on the GPU: BatchNorm under autocast, fp32 master weights."""
    train, _ = load_dataset("synthetic-cifar", num_samples=2048)
    x, y = torch.from_numpy(train.x), torch.from_numpy(train.y)
    torch.manual_seed(0)
    model = build_model("edge-resnet", input_shape=tuple(x.shape[1:]), num_classes=10)
    trainer = LocalTrainer(model, lr=0.05, momentum=0.9, device=CUDA, precision="fp16", seed=0)
    first = trainer.train_cycle(x[:1024], y[:1024], 32)
    for _ in range(3):
        last = trainer.train_cycle(x[:1024], y[:1024], 32)
    assert math.isfinite(first.loss) and last.loss < first.loss, (first.loss, last.loss)
    buffers = dict(trainer.model.named_buffers())
    variances = [b for n, b in buffers.items() if n.endswith("running_var")]
    assert variances and all(bool(torch.isfinite(v).all()) and bool((v >= 0).all()) for v in variances)
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())


@pytest.mark.parametrize("codec", ["int8", "topk"])
def test_gpu_agents_with_compressed_pushes_reach_the_target(codec: str, tmp_path: Path) -> None:
    """Compressed pushes (issue 31) from agents that train on the GPU: the codec runs on what the
    GPU produced, the server folds the decompressed update."""
    out = tmp_path / codec
    run_testbed(out, "--device", "cuda", "--clients", "2", "--profile", "hl2", "--preset", "asp",
                "--target-accuracy", "0.9", "--quiet", "--set", f"compression.push={codec}",
                "--set", "compression.pull=fp16", timeout=300)
    summary = json.loads((out / "server_summary.json").read_text())
    assert summary["outcome"] == "target_reached", summary["stop_reason"]
    assert summary["config"]["compression"]["push"] == codec
    assert all(w["device"].startswith("cuda") for w in summary["workers"])
