"""The edge-sized built-ins of issue 31: edge-resnet's size, synthetic-cifar's determinism and shape, and the
CIFAR-10 binary batches (read without any pickle)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from hermes.common.builtin_task import DATASET_SHAPES
from hermes.common.datasets import DatasetCorrupt, load_dataset, make_synthetic_cifar
from hermes.common.models import build_model, count_parameters


def test_edge_resnet_is_edge_sized_and_runs_on_32x32_colour() -> None:
    torch.manual_seed(0)
    model = build_model("edge-resnet", input_shape=(3, 32, 32), num_classes=10)
    assert 1_000_000 <= count_parameters(model) <= 5_000_000
    assert count_parameters(model) == 1_210_410
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    assert count_parameters(build_model("edge-resnet", input_shape=(3, 32, 32), num_classes=10, width=8)) < 100_000
    with pytest.raises(TypeError, match="unknown keyword"):
        build_model("edge-resnet", input_shape=(3, 32, 32), num_classes=10, depth=3)


def test_a_stride_2_stem_keeps_the_parameters_and_quarters_the_feature_maps() -> None:
    torch.manual_seed(0)
    full = build_model("edge-resnet", input_shape=(3, 32, 32), num_classes=10)
    small = build_model("edge-resnet", input_shape=(3, 32, 32), num_classes=10, stem_stride=2)
    assert count_parameters(small) == count_parameters(full) == 1_210_410
    x = torch.randn(2, 3, 32, 32)
    assert full.stem(x).shape[-2:] == (32, 32) and small.stem(x).shape[-2:] == (16, 16)
    assert small(x).shape == (2, 10)
    with pytest.raises(ValueError, match="stem_stride must be 1 or 2"):
        build_model("edge-resnet", input_shape=(3, 32, 32), num_classes=10, stem_stride=4)
    with pytest.raises(ValueError, match="edge-resnet"):  # 8x8 halved in the stem is too small for three stages
        build_model("edge-resnet", input_shape=(3, 8, 8), num_classes=10, stem_stride=2)


def test_group_norm_keeps_the_parameters_and_drops_the_running_statistics() -> None:
    # The asynchronous presets add workers' changes; a running variance summed that way went below zero.
    torch.manual_seed(0)
    batch = build_model("edge-resnet", input_shape=(3, 32, 32), num_classes=10, stem_stride=2)
    group = build_model("edge-resnet", input_shape=(3, 32, 32), num_classes=10, stem_stride=2, norm="group")
    assert count_parameters(group) == count_parameters(batch) == 1_210_410
    assert sum(b.numel() for b in batch.buffers()) > 0 and list(group.buffers()) == []
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in group.modules())
    assert sum(isinstance(m, torch.nn.GroupNorm) for m in group.modules()) == 10  # stem, 3 blocks x (2 + shortcut)
    group.eval()
    x = torch.randn(3, 3, 32, 32)
    # No running statistics: a sample's output does not depend on the others in its batch, in either mode.
    assert torch.allclose(group(x)[:1], group(x[:1]), atol=1e-5)
    with pytest.raises(ValueError, match="norm must be 'batch' or 'group'"):
        build_model("edge-resnet", input_shape=(3, 32, 32), num_classes=10, norm="layer")


def test_synthetic_cifar_is_cifar_shaped_balanced_and_deterministic() -> None:
    train, test = make_synthetic_cifar(200, seed=1)
    again, _ = make_synthetic_cifar(200, seed=1)
    other, _ = make_synthetic_cifar(200, seed=2)
    assert train.x.shape[1:] == (3, 32, 32) == DATASET_SHAPES["synthetic-cifar"][0]
    assert len(train) + len(test) == 200
    assert np.array_equal(train.x, again.x) and np.array_equal(train.y, again.y)
    assert not np.array_equal(train.x, other.x)
    assert sorted(np.bincount(train.y, minlength=10)) == [16] * 10
    assert load_dataset("synthetic-cifar", num_samples=100, seed=0)[0].x.shape == (80, 3, 32, 32)


def _write_bin(folder: Path, name: str, labels: list[int]) -> np.ndarray:
    rng = np.random.default_rng(len(labels))
    pixels = rng.integers(0, 256, (len(labels), 3072), dtype=np.uint8)
    records = np.concatenate([np.asarray(labels, dtype=np.uint8)[:, None], pixels], axis=1)
    records.tofile(folder / name)
    return pixels


def test_cifar10_binary_batches_are_read_without_pickle(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-10-batches-bin"
    folder.mkdir()
    for i in range(1, 6):
        _write_bin(folder, f"data_batch_{i}.bin", [j % 10 for j in range(20)])
    _write_bin(folder, "test_batch.bin", [j % 10 for j in range(10)])
    train, test = load_dataset("cifar10", root=str(tmp_path), seed=0)
    assert train.x.shape == (100, 3, 32, 32) and test.x.shape == (10, 3, 32, 32)
    assert list(test.y) == list(range(10))
    (folder / "test_batch.bin").write_bytes(b"\x00" * 3000)
    with pytest.raises(DatasetCorrupt, match="whole number"):
        load_dataset("cifar10", root=str(tmp_path), seed=0)
