"""Data set loaders: splits, normalisation, file parsing and refusal of bad files."""

from __future__ import annotations

import gzip
import os
import pickle
import random
import socket
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from hermes.common.datasets import (
    DATASET_NAMES,
    ArrayDataset,
    DatasetCorrupt,
    DatasetUnavailable,
    load_dataset,
    make_synthetic,
    read_idx,
)


def _assert_well_formed(ds: ArrayDataset, shape: tuple[int, ...], num_classes: int) -> None:
    assert ds.x.dtype == np.float32 and ds.x.flags.c_contiguous
    assert ds.y.dtype == np.int64 and ds.y.shape == (len(ds),)
    assert ds.input_shape == shape and ds.x.shape == (len(ds), *shape)
    assert ds.num_classes == num_classes
    assert ds.y.min() >= 0 and ds.y.max() < num_classes


def _assert_standardised(ds: ArrayDataset) -> None:
    axes = (0,) + tuple(range(2, ds.x.ndim))
    np.testing.assert_allclose(ds.x.mean(axis=axes, dtype=np.float64), 0.0, atol=1e-4)
    np.testing.assert_allclose(ds.x.std(axis=axes, dtype=np.float64), 1.0, atol=1e-4)


# ---------------------------------------------------------------- general


def test_array_dataset_validates_its_arrays():
    x = np.zeros((4, 1, 2, 2), np.float32)
    y = np.arange(4, dtype=np.int64)
    ds = ArrayDataset("t", x, y, 4)
    assert len(ds) == 4 and ds.input_shape == (1, 2, 2)
    with pytest.raises(ValueError, match="float32"):
        ArrayDataset("t", x.astype(np.float64), y, 4)
    with pytest.raises(ValueError, match="C-contiguous"):
        ArrayDataset("t", np.asfortranarray(np.zeros((4, 3), np.float32)), y, 4)
    with pytest.raises(ValueError, match="int64"):
        ArrayDataset("t", x, y.astype(np.int32), 4)
    with pytest.raises(ValueError, match="labels"):
        ArrayDataset("t", x, y, 3)
    with pytest.raises(AttributeError):
        ds.name = "other"  # type: ignore[misc]


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError) as info:
        load_dataset("imagenet")
    assert all(n in str(info.value) for n in DATASET_NAMES)


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 1.5])
def test_test_fraction_must_be_a_proper_fraction(fraction):
    with pytest.raises(ValueError, match="test_fraction"):
        load_dataset("synthetic", test_fraction=fraction)


# ---------------------------------------------------------------- digits


def _digits_raw() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return bunch.data.astype(np.int64), bunch.target.astype(np.int64)


def _recover_digit_pixels(train: ArrayDataset, ds: ArrayDataset) -> np.ndarray:
    # Standardisation is affine and the training split holds both 0 and 16,
    # so its min and max give back the integer pixel values.
    lo, hi = train.x.min(), train.x.max()
    return np.rint((ds.x.reshape(len(ds), -1) - lo) / (hi - lo) * 16).astype(np.int64)


def test_digits_split_sizes_shapes_and_normalisation():
    train, test = load_dataset("digits", seed=0, test_fraction=0.2)
    assert (len(train), len(test)) == (1437, 360)
    _assert_well_formed(train, (1, 8, 8), 10)
    _assert_well_formed(test, (1, 8, 8), 10)
    _assert_standardised(train)


def test_digits_split_is_stratified():
    _, y = _digits_raw()
    for fraction in (0.2, 0.5):
        train, test = load_dataset("digits", seed=3, test_fraction=fraction)
        per_class = np.bincount(y, minlength=10)
        test_counts = np.bincount(test.y, minlength=10)
        assert np.all(np.abs(test_counts - per_class * fraction) <= 1), test_counts
        np.testing.assert_array_equal(np.bincount(train.y, minlength=10) + test_counts, per_class)


def test_digits_split_is_a_partition_without_overlap():
    x, y = _digits_raw()
    train, test = load_dataset("digits", seed=1)
    rows = lambda pixels, labels: Counter(  # noqa: E731
        (tuple(p), int(t)) for p, t in zip(pixels, labels)
    )
    train_rows = rows(_recover_digit_pixels(train, train), train.y)
    test_rows = rows(_recover_digit_pixels(train, test), test.y)
    # Every original example lands in exactly one split.
    assert train_rows + test_rows == rows(x, y)
    everything = rows(x, y)
    for key in test_rows.keys() & train_rows.keys():
        # Only true duplicates in the source may show up on both sides.
        assert everything[key] > 1


def test_digits_split_depends_on_seed_only():
    a_train, a_test = load_dataset("digits", seed=7)
    b_train, b_test = load_dataset("digits", seed=7)
    np.testing.assert_array_equal(a_train.x, b_train.x)
    np.testing.assert_array_equal(a_test.y, b_test.y)
    c_train, _ = load_dataset("digits", seed=8)
    assert not np.array_equal(a_train.y, c_train.y)


def test_digits_num_samples_caps_the_training_split():
    train, test = load_dataset("digits", num_samples=100)
    assert (len(train), len(test)) == (100, 360)


# ---------------------------------------------------------------- mnist1d


def test_mnist1d_generates_locally(monkeypatch, tmp_path):
    pytest.importorskip("mnist1d")
    monkeypatch.setenv("HERMES_DATA_CACHE", str(tmp_path))  # an empty cache: the first load generates

    def no_network(*args, **kwargs):
        raise AssertionError("mnist1d loader tried to use the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    random.seed(123)
    np.random.seed(123)
    expected_py, expected_np = random.random(), np.random.rand()
    random.seed(123)
    np.random.seed(123)
    train, test = load_dataset("mnist1d", num_samples=500, seed=0)
    # The generator reseeds numpy and random globally; the loader undoes that.
    assert (random.random(), np.random.rand()) == (expected_py, expected_np)
    assert (len(train), len(test)) == (400, 100)
    _assert_well_formed(train, (1, 40), 10)
    _assert_well_formed(test, (1, 40), 10)
    _assert_standardised(train)
    again, _ = load_dataset("mnist1d", num_samples=500, seed=0)
    np.testing.assert_array_equal(train.x, again.x)
    other, _ = load_dataset("mnist1d", num_samples=500, seed=1)
    assert not np.array_equal(train.x, other.x)


def _counting_generator(monkeypatch) -> list[int]:
    import mnist1d.data

    calls: list[int] = []
    real = mnist1d.data.make_dataset

    def counted(args):
        calls.append(args.seed)
        return real(args)

    monkeypatch.setattr(mnist1d.data, "make_dataset", counted)
    return calls


def test_mnist1d_is_generated_once_then_read_from_the_cache(monkeypatch, tmp_path):
    pytest.importorskip("mnist1d")
    monkeypatch.setenv("HERMES_DATA_CACHE", str(tmp_path))
    calls = _counting_generator(monkeypatch)
    first, first_test = load_dataset("mnist1d", num_samples=300, seed=4)
    again, again_test = load_dataset("mnist1d", num_samples=300, seed=4)
    assert calls == [4] and len(list(tmp_path.glob("mnist1d-*.npz"))) == 1
    np.testing.assert_array_equal(first.x, again.x)
    np.testing.assert_array_equal(first.y, again.y)
    np.testing.assert_array_equal(first_test.x, again_test.x)
    assert (again.x.dtype, again.y.dtype, again.num_classes) == (np.float32, np.int64, 10)
    load_dataset("mnist1d", num_samples=300, seed=5)  # other inputs, another file
    load_dataset("mnist1d", num_samples=300, seed=4, test_fraction=0.25)
    assert calls == [4, 5, 4] and len(list(tmp_path.glob("mnist1d-*.npz"))) == 3
    monkeypatch.setenv("HERMES_DATA_CACHE", "off")
    fresh, _ = load_dataset("mnist1d", num_samples=300, seed=4)
    np.testing.assert_array_equal(fresh.x, first.x)  # what the cache gave is what generation gives
    assert calls == [4, 5, 4, 4]


def test_a_damaged_cache_file_is_generated_again_and_an_unwritable_cache_is_skipped(monkeypatch, tmp_path, caplog):
    pytest.importorskip("mnist1d")
    monkeypatch.setenv("HERMES_DATA_CACHE", str(tmp_path))
    want, _ = load_dataset("mnist1d", num_samples=300, seed=6)
    (path,) = tmp_path.glob("mnist1d-*.npz")
    path.write_bytes(path.read_bytes()[:1000])  # cut short, as by a full disk
    calls = _counting_generator(monkeypatch)
    with caplog.at_level("WARNING", logger="hermes.common.dataset_cache"):
        got, _ = load_dataset("mnist1d", num_samples=300, seed=6)
    assert calls == [6] and "cannot be read" in caplog.text and "generating it again" in caplog.text
    np.testing.assert_array_equal(got.x, want.x)
    load_dataset("mnist1d", num_samples=300, seed=6)
    assert calls == [6]  # the damaged file was replaced by a whole one
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("HERMES_DATA_CACHE", str(blocker / "datasets"))
    got, _ = load_dataset("mnist1d", num_samples=300, seed=6)
    np.testing.assert_array_equal(got.x, want.x)
    assert calls == [6, 6]


def test_mnist1d_default_size_matches_the_reference_split():
    pytest.importorskip("mnist1d")
    train, test = load_dataset("mnist1d")
    assert (len(train), len(test)) == (4000, 1000)


def test_mnist1d_missing_package_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "mnist1d", None)
    monkeypatch.setitem(sys.modules, "mnist1d.data", None)
    with pytest.raises(DatasetUnavailable, match="pip install mnist1d"):
        load_dataset("mnist1d")


# ---------------------------------------------------------------- synthetic


def test_synthetic_size_and_determinism():
    train, test = load_dataset("synthetic")
    assert (len(train), len(test)) == (8000, 2000)
    _assert_well_formed(train, (1, 8, 8), 10)
    _assert_standardised(train)
    assert set(np.bincount(train.y)) == {800}
    small_train, small_test = load_dataset("synthetic", num_samples=1000, seed=4, test_fraction=0.3)
    assert (len(small_train), len(small_test)) == (700, 300)
    again_train, again_test = load_dataset("synthetic", num_samples=1000, seed=4, test_fraction=0.3)
    np.testing.assert_array_equal(small_train.x, again_train.x)
    np.testing.assert_array_equal(small_test.y, again_test.y)
    other, _ = load_dataset("synthetic", num_samples=1000, seed=5, test_fraction=0.3)
    assert not np.array_equal(small_train.x, other.x)


def test_synthetic_is_learnable_but_not_linearly_trivial():
    from sklearn.linear_model import LogisticRegression

    train, test = load_dataset("synthetic", num_samples=3000, seed=0)
    clf = LogisticRegression(max_iter=300).fit(train.x.reshape(len(train), -1), train.y)
    accuracy = clf.score(test.x.reshape(len(test), -1), test.y)
    assert 0.4 < accuracy < 0.9


def test_make_synthetic_takes_other_shapes():
    train, test = make_synthetic(200, input_shape=(2, 5), num_classes=4, seed=0)
    _assert_well_formed(train, (2, 5), 4)
    assert len(train) + len(test) == 200


# ---------------------------------------------------------------- mnist (IDX)


def _idx_bytes(array: np.ndarray, magic: int | None = None) -> bytes:
    magic = (0x08 << 8 | array.ndim) if magic is None else magic
    header = magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in array.shape)
    return header + array.astype(np.uint8).tobytes()


def _write(path: Path, payload: bytes, gz: bool = False) -> Path:
    if gz:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(payload))
    else:
        path.write_bytes(payload)
    return path


def _fake_mnist(folder: Path, *, gz: bool = False, n_train: int = 30, n_test: int = 12):
    rng = np.random.default_rng(0)
    raw = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte": rng.integers(0, 10, n_train, dtype=np.uint8),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": rng.integers(0, 10, n_test, dtype=np.uint8),
    }
    folder.mkdir(parents=True, exist_ok=True)
    for name, array in raw.items():
        _write(folder / name, _idx_bytes(array), gz=gz)
    return raw


@pytest.mark.parametrize("gz", [False, True])
def test_mnist_idx_round_trip(tmp_path, gz):
    raw = _fake_mnist(tmp_path, gz=gz)
    train, test = load_dataset("mnist", root=str(tmp_path))
    _assert_well_formed(train, (1, 28, 28), 10)
    _assert_well_formed(test, (1, 28, 28), 10)
    np.testing.assert_array_equal(train.y, raw["train-labels-idx1-ubyte"])
    np.testing.assert_array_equal(test.y, raw["t10k-labels-idx1-ubyte"])
    unit_train = raw["train-images-idx3-ubyte"].astype(np.float64) / 255
    mean, std = unit_train.mean(), unit_train.std()
    np.testing.assert_allclose(train.x[:, 0], (unit_train - mean) / std, atol=1e-5)
    # The test split is scaled with the training statistics, not its own.
    unit_test = raw["t10k-images-idx3-ubyte"].astype(np.float64) / 255
    np.testing.assert_allclose(test.x[:, 0], (unit_test - mean) / std, atol=1e-5)


def test_mnist_reads_the_torchvision_layout_and_caps_training(tmp_path):
    _fake_mnist(tmp_path / "MNIST" / "raw")
    train, test = load_dataset("mnist", root=str(tmp_path), num_samples=10)
    assert (len(train), len(test)) == (10, 12)


def test_read_idx_parses_header_dims(tmp_path):
    array = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    path = _write(tmp_path / "a-idx3-ubyte", _idx_bytes(array))
    np.testing.assert_array_equal(read_idx(str(path), ndim=3), array)
    with pytest.raises(DatasetCorrupt, match="magic number 0x00000803"):
        read_idx(str(path), ndim=1)


def test_mnist_corrupt_magic_names_the_file(tmp_path):
    raw = _fake_mnist(tmp_path)
    bad = _write(
        tmp_path / "train-images-idx3-ubyte",
        _idx_bytes(raw["train-images-idx3-ubyte"], magic=0x00000D03),  # float code, not ubyte
    )
    with pytest.raises(DatasetCorrupt, match="magic number 0x00000d03") as info:
        load_dataset("mnist", root=str(tmp_path))
    assert str(bad) in str(info.value)


def test_mnist_truncated_and_inconsistent_files(tmp_path):
    raw = _fake_mnist(tmp_path)
    labels = tmp_path / "t10k-labels-idx1-ubyte"
    labels.write_bytes(_idx_bytes(raw["t10k-labels-idx1-ubyte"])[:-3])
    with pytest.raises(DatasetCorrupt, match="holds") as info:
        load_dataset("mnist", root=str(tmp_path))
    assert str(labels) in str(info.value)
    labels.write_bytes(_idx_bytes(raw["t10k-labels-idx1-ubyte"][:-1]))
    with pytest.raises(DatasetCorrupt, match="labels"):
        load_dataset("mnist", root=str(tmp_path))


def test_mnist_bad_gzip_names_the_file(tmp_path):
    _fake_mnist(tmp_path)
    os.remove(tmp_path / "train-labels-idx1-ubyte")
    bad = tmp_path / "train-labels-idx1-ubyte.gz"
    bad.write_bytes(b"this is not gzip data")
    with pytest.raises(DatasetCorrupt) as info:
        load_dataset("mnist", root=str(tmp_path))
    assert str(bad) in str(info.value)
    labels = np.zeros(30, np.uint8)
    whole = gzip.compress(_idx_bytes(labels))
    bad.write_bytes(whole[: len(whole) // 2])  # cut off mid-stream
    with pytest.raises(DatasetCorrupt) as info:
        load_dataset("mnist", root=str(tmp_path))
    assert str(bad) in str(info.value)


def test_mnist_missing_files(tmp_path):
    with pytest.raises(DatasetUnavailable, match="t10k-images-idx3-ubyte"):
        load_dataset("mnist")
    _fake_mnist(tmp_path)
    os.remove(tmp_path / "t10k-images-idx3-ubyte")
    with pytest.raises(DatasetUnavailable, match="t10k-images-idx3-ubyte") as info:
        load_dataset("mnist", root=str(tmp_path))
    assert str(tmp_path) in str(info.value)
    assert not isinstance(info.value, DatasetCorrupt)


# ---------------------------------------------------------------- cifar10

_TRAIN_BATCHES = [f"data_batch_{i}" for i in range(1, 6)]


def _batch_bytes(data: np.ndarray, labels: list[int]) -> bytes:
    # Protocol 3 pickles bytes and arrays with only the numpy globals the
    # official (Python 2) batches use; bytes keys, as those batches have.
    return pickle.dumps({b"batch_label": b"fake", b"data": data, b"labels": labels}, protocol=3)


def _fake_cifar(folder: Path, per_batch: int = 4) -> dict[str, tuple[np.ndarray, list[int]]]:
    rng = np.random.default_rng(1)
    folder.mkdir(parents=True, exist_ok=True)
    batches = {}
    for name in _TRAIN_BATCHES + ["test_batch"]:
        data = rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8)
        labels = [int(v) for v in rng.integers(0, 10, per_batch)]
        (folder / name).write_bytes(_batch_bytes(data, labels))
        batches[name] = (data, labels)
    return batches


def test_cifar10_loads_fake_batches(tmp_path):
    batches = _fake_cifar(tmp_path)
    train, test = load_dataset("cifar10", root=str(tmp_path))
    _assert_well_formed(train, (3, 32, 32), 10)
    _assert_well_formed(test, (3, 32, 32), 10)
    assert (len(train), len(test)) == (20, 4)
    expected_labels = sum((batches[b][1] for b in _TRAIN_BATCHES), [])
    np.testing.assert_array_equal(train.y, expected_labels)
    unit = np.concatenate([batches[b][0] for b in _TRAIN_BATCHES]).reshape(-1, 3, 32, 32) / 255.0
    mean = unit.mean(axis=(0, 2, 3), keepdims=True)
    std = unit.std(axis=(0, 2, 3), keepdims=True)
    np.testing.assert_allclose(train.x, (unit - mean) / std, atol=1e-5)
    _assert_standardised(train)
    unit_test = batches["test_batch"][0].reshape(-1, 3, 32, 32) / 255.0
    np.testing.assert_allclose(test.x, (unit_test - mean) / std, atol=1e-5)
    # Plane order: the first 1024 bytes of a row are the red channel.
    red = batches["data_batch_1"][0][0, :1024] / 255.0
    expected_red = (red - mean[0, 0, 0, 0]) / std[0, 0, 0, 0]
    np.testing.assert_allclose(train.x[0, 0].ravel(), expected_red, atol=1e-5)


def test_cifar10_finds_the_batches_subfolder_and_caps_training(tmp_path):
    _fake_cifar(tmp_path / "cifar-10-batches-py")
    train, test = load_dataset("cifar10", root=str(tmp_path), num_samples=7)
    assert (len(train), len(test)) == (7, 4)


def test_cifar10_accepts_the_legacy_numpy_module_name(tmp_path):
    _fake_cifar(tmp_path)
    path = tmp_path / "test_batch"
    blob = path.read_bytes()
    # numpy 1.x and the official batches name numpy.core, numpy 2 numpy._core.
    legacy = blob.replace(b"numpy._core.multiarray\n", b"numpy.core.multiarray\n")
    assert legacy != blob
    path.write_bytes(legacy)
    _, test = load_dataset("cifar10", root=str(tmp_path))
    assert len(test) == 4


class _Exploit:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_cifar10_refuses_pickles_with_other_globals(tmp_path):
    _fake_cifar(tmp_path)
    marker = tmp_path / "pwned"
    evil = {b"data": _Exploit(marker), b"labels": [0]}
    bad = tmp_path / "data_batch_3"
    bad.write_bytes(pickle.dumps(evil, protocol=3))
    with pytest.raises(DatasetCorrupt, match="refused global") as info:
        load_dataset("cifar10", root=str(tmp_path))
    assert str(bad) in str(info.value)
    assert not marker.exists()
    bad.write_bytes(pickle.dumps({b"data": bytearray(3)}, protocol=3))  # builtins.bytearray
    with pytest.raises(DatasetCorrupt, match="refused global builtins.bytearray"):
        load_dataset("cifar10", root=str(tmp_path))


def test_cifar10_rejects_malformed_batches(tmp_path):
    _fake_cifar(tmp_path)
    bad = tmp_path / "data_batch_2"
    bad.write_bytes(_batch_bytes(np.zeros((2, 100), np.uint8), [0, 1]))
    with pytest.raises(DatasetCorrupt, match="3072"):
        load_dataset("cifar10", root=str(tmp_path))
    bad.write_bytes(_batch_bytes(np.zeros((2, 3072), np.uint8), [0]))
    with pytest.raises(DatasetCorrupt, match="labels"):
        load_dataset("cifar10", root=str(tmp_path))
    bad.write_bytes(b"not a pickle")
    with pytest.raises(DatasetCorrupt):
        load_dataset("cifar10", root=str(tmp_path))


def test_cifar10_missing_files(tmp_path):
    with pytest.raises(DatasetUnavailable, match="data_batch_1"):
        load_dataset("cifar10")
    _fake_cifar(tmp_path)
    os.remove(tmp_path / "test_batch")
    with pytest.raises(DatasetUnavailable, match="test_batch") as info:
        load_dataset("cifar10", root=str(tmp_path))
    assert str(tmp_path) in str(info.value)
