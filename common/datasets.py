"""Classification data sets as in-memory numpy arrays.

``load_dataset(name)`` returns ``(train, test)`` :class:`ArrayDataset` pairs
with float32 inputs of shape ``(N, *input_shape)`` and int64 labels. Inputs
are standardised per channel with statistics of the training split only, so
nothing about the test split leaks into training.

``digits`` ships with scikit-learn, ``mnist1d`` and ``synthetic`` are
generated locally; ``mnist`` and ``cifar10`` are read from files the caller
has already put under ``root``. Nothing here touches the network.
"""

from __future__ import annotations

import gzip
import logging
import math
import os
import pickle
import random
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

logger = logging.getLogger(__name__)

DATASET_NAMES = ("digits", "mnist1d", "synthetic", "mnist", "cifar10")

_EPS = 1e-6
_MNIST1D_DEFAULT_SAMPLES = 5000
_SYNTHETIC_DEFAULT_SAMPLES = 10000


class DatasetUnavailable(Exception):
    """The data set cannot be produced here: files or packages are missing."""


class DatasetCorrupt(DatasetUnavailable):
    """The data set's files exist but are not what they claim to be."""


@dataclass(frozen=True)
class ArrayDataset:
    name: str
    x: np.ndarray
    y: np.ndarray
    num_classes: int

    def __post_init__(self) -> None:
        if self.x.dtype != np.float32 or not self.x.flags.c_contiguous or self.x.ndim < 2:
            raise ValueError(
                f"{self.name}: x must be a C-contiguous float32 array (N, *input_shape), "
                f"got {self.x.dtype} {self.x.shape}"
            )
        if self.y.dtype != np.int64 or self.y.shape != (self.x.shape[0],):
            raise ValueError(
                f"{self.name}: y must be int64 of shape ({self.x.shape[0]},), "
                f"got {self.y.dtype} {self.y.shape}"
            )
        if len(self.y) and (self.y.min() < 0 or self.y.max() >= self.num_classes):
            raise ValueError(f"{self.name}: labels fall outside [0, {self.num_classes})")

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[1:])

    def __len__(self) -> int:
        return int(self.x.shape[0])


def load_dataset(
    name: str,
    *,
    root: str | None = None,
    seed: int = 0,
    test_fraction: float = 0.2,
    num_samples: int | None = None,
) -> tuple[ArrayDataset, ArrayDataset]:
    """Load data set ``name`` as ``(train, test)``.

    ``seed`` and ``test_fraction`` drive the split of data sets without an
    official one (digits, mnist1d, synthetic); mnist and cifar10 keep their
    official split and ignore ``test_fraction``. ``num_samples`` is the total
    size of a generated set (mnist1d, synthetic) and, for the fixed ones
    (digits, mnist, cifar10), a cap on the training examples kept: a subset
    drawn with ``seed``; the test split stays whole.
    """
    loader = _LOADERS.get(name)
    if loader is None:
        raise ValueError(f"unknown data set {name!r}; expected one of {DATASET_NAMES}")
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must lie in (0, 1), got {test_fraction!r}")
    if num_samples is not None and num_samples < 1:
        raise ValueError(f"num_samples must be a positive int, got {num_samples!r}")
    train, test = loader(root=root, seed=seed, test_fraction=test_fraction, num_samples=num_samples)
    logger.info(
        "loaded %s: %d train, %d test, input %s, %d classes",
        name, len(train), len(test), train.input_shape, train.num_classes,
    )
    return train, test


# ---------------------------------------------------------------- helpers


def _standardise(train_x: np.ndarray, test_x: np.ndarray) -> None:
    """Shift and scale both splits in place to zero mean and unit variance per
    channel (axis 1), using the training split's statistics."""
    for c in range(train_x.shape[1]):
        channel = train_x[:, c]
        # One channel at a time with float64 sums: a float64 copy of all of
        # CIFAR-10 would take 1.2 GB, and float32 sums over 50M pixels drift.
        mean = channel.sum(dtype=np.float64) / channel.size
        centred = channel - np.float32(mean)
        np.square(centred, out=centred)
        std = max(math.sqrt(centred.sum(dtype=np.float64) / channel.size), _EPS)
        for x in (train_x, test_x):
            x[:, c] -= np.float32(mean)
            x[:, c] /= np.float32(std)


def _to_unit(raw: np.ndarray) -> np.ndarray:
    """uint8 pixels to float32 in [0, 1], with a single float copy."""
    x = raw.astype(np.float32)
    x /= 255.0
    return x


def _stratified_split(
    y: np.ndarray, test_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.model_selection import train_test_split

    idx = np.arange(len(y))
    train_idx, test_idx = train_test_split(
        idx, test_size=test_fraction, stratify=y, random_state=seed, shuffle=True
    )
    return np.sort(train_idx), np.sort(test_idx)


def _cap(
    x: np.ndarray, y: np.ndarray, limit: int | None, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    if limit is None or limit >= len(y):
        return x, y
    keep = np.sort(np.random.default_rng(seed).choice(len(y), size=limit, replace=False))
    return x[keep], y[keep]


def _make_pair(
    name: str,
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    num_classes: int,
) -> tuple[ArrayDataset, ArrayDataset]:
    x_train = np.ascontiguousarray(x_train, dtype=np.float32)
    x_test = np.ascontiguousarray(x_test, dtype=np.float32)
    _standardise(x_train, x_test)
    return (
        ArrayDataset(name, x_train, np.asarray(y_train, dtype=np.int64), num_classes),
        ArrayDataset(name, x_test, np.asarray(y_test, dtype=np.int64), num_classes),
    )


# ---------------------------------------------------------------- digits


def _load_digits(
    *, root: str | None, seed: int, test_fraction: float, num_samples: int | None
) -> tuple[ArrayDataset, ArrayDataset]:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = (np.asarray(bunch.data, dtype=np.float32) / 16.0).reshape(-1, 1, 8, 8)
    y = np.asarray(bunch.target, dtype=np.int64)
    train_idx, test_idx = _stratified_split(y, test_fraction, seed)
    x_train, y_train = _cap(x[train_idx], y[train_idx], num_samples, seed)
    return _make_pair("digits", x_train, y_train, x[test_idx], y[test_idx], 10)


# ---------------------------------------------------------------- mnist1d


def _load_mnist1d(
    *, root: str | None, seed: int, test_fraction: float, num_samples: int | None
) -> tuple[ArrayDataset, ArrayDataset]:
    try:
        # Only make_dataset/get_dataset_args: mnist1d's get_dataset would
        # download a pickle from GitHub.
        from mnist1d.data import get_dataset_args, make_dataset
    except ImportError as exc:
        raise DatasetUnavailable(
            "data set 'mnist1d' needs the mnist1d package: pip install mnist1d "
            "(or pip install 'hermes-edge[data]')"
        ) from exc
    total = _MNIST1D_DEFAULT_SAMPLES if num_samples is None else num_samples
    if total < 20:
        raise ValueError(f"mnist1d needs num_samples >= 20 (two per class per split), got {total}")
    args = get_dataset_args()
    args.num_samples = total
    args.train_split = 1.0 - test_fraction
    args.seed = seed
    # make_dataset reseeds the global `random` and numpy generators; put them
    # back so loading data does not change anyone else's random stream.
    py_state, np_state = random.getstate(), np.random.get_state()
    try:
        data = make_dataset(args)
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
    length = int(args.final_seq_length)
    x_train = np.asarray(data["x"], dtype=np.float32).reshape(-1, 1, length)
    x_test = np.asarray(data["x_test"], dtype=np.float32).reshape(-1, 1, length)
    return _make_pair(
        "mnist1d", x_train, data["y"], x_test, data["y_test"], len(data["templates"]["y"])
    )


# ---------------------------------------------------------------- synthetic


def make_synthetic(
    num_samples: int = _SYNTHETIC_DEFAULT_SAMPLES,
    *,
    input_shape: tuple[int, ...] = (1, 8, 8),
    num_classes: int = 10,
    seed: int = 0,
    test_fraction: float = 0.2,
    clusters_per_class: int = 3,
    separation: float = 0.5,
) -> tuple[ArrayDataset, ArrayDataset]:
    """A seeded mixture of Gaussians: every class owns ``clusters_per_class``
    unit-variance clusters whose centres are drawn ``N(0, separation^2)``.

    Several clusters per class and overlapping clusters keep it from being
    linearly separable: a linear model lands well above chance but short of
    what a nonlinear one reaches.
    """
    if num_samples < 2 * num_classes:
        raise ValueError(
            f"synthetic needs num_samples >= {2 * num_classes} (two per class), got {num_samples}"
        )
    rng = np.random.default_rng(seed)
    dim = math.prod(input_shape)
    centres = rng.normal(0.0, separation, size=(num_classes, clusters_per_class, dim))
    # Balanced labels, so the stratified split below is exact up to rounding.
    y = rng.permutation(np.arange(num_samples) % num_classes).astype(np.int64)
    cluster = rng.integers(0, clusters_per_class, size=num_samples)
    x = (centres[y, cluster] + rng.standard_normal((num_samples, dim))).astype(np.float32).reshape(num_samples, *input_shape)
    train_idx, test_idx = _stratified_split(y, test_fraction, seed)
    return _make_pair(
        "synthetic", x[train_idx], y[train_idx], x[test_idx], y[test_idx], num_classes
    )


def _load_synthetic(
    *, root: str | None, seed: int, test_fraction: float, num_samples: int | None
) -> tuple[ArrayDataset, ArrayDataset]:
    total = _SYNTHETIC_DEFAULT_SAMPLES if num_samples is None else num_samples
    return make_synthetic(total, seed=seed, test_fraction=test_fraction)


# ---------------------------------------------------------------- mnist (IDX)

_IDX_UBYTE = 0x08
_MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}


def read_idx(path: str, *, ndim: int) -> np.ndarray:
    """Read an unsigned-byte IDX file (optionally gzipped) with ``ndim`` dims.

    The header is two zero bytes, a type code (0x08 = uint8), the number of
    dimensions, then each dimension as a big-endian uint32.
    """
    opener: Callable[..., BinaryIO] = (
        gzip.open if path.endswith(".gz") else open  # type: ignore[assignment]
    )
    try:
        with opener(path, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError as exc:
        raise DatasetUnavailable(f"IDX file {path} does not exist") from exc
    except (OSError, EOFError, zlib.error) as exc:  # bad or truncated gzip streams
        raise DatasetCorrupt(f"cannot read IDX file {path}: {exc}") from exc
    if len(raw) < 4:
        raise DatasetCorrupt(f"IDX file {path} is too short for a header ({len(raw)} bytes)")
    zero, dtype_code, dims = int.from_bytes(raw[:2], "big"), raw[2], raw[3]
    if zero != 0 or dtype_code != _IDX_UBYTE or dims != ndim:
        raise DatasetCorrupt(
            f"IDX file {path} has magic number 0x{int.from_bytes(raw[:4], 'big'):08x}; "
            f"expected 0x{_IDX_UBYTE << 8 | ndim:08x} (unsigned bytes, {ndim} dims)"
        )
    header_len = 4 + 4 * ndim
    if len(raw) < header_len:
        raise DatasetCorrupt(f"IDX file {path} is truncated inside its header")
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    expected = header_len + math.prod(shape)
    if len(raw) != expected:
        raise DatasetCorrupt(
            f"IDX file {path} declares shape {shape} ({expected} bytes with header) "
            f"but holds {len(raw)} bytes"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header_len).reshape(shape)


def _find_mnist_file(root: str, stem: str) -> str | None:
    # torchvision keeps its downloads in root/MNIST/raw; accept that layout too.
    for folder in (root, os.path.join(root, "MNIST", "raw")):
        for candidate in (stem, stem + ".gz"):
            path = os.path.join(folder, candidate)
            if os.path.isfile(path):
                return path
    return None


def _mnist_split(root: str, images_stem: str, labels_stem: str) -> tuple[np.ndarray, np.ndarray]:
    paths = [_find_mnist_file(root, s) for s in (images_stem, labels_stem)]
    if None in paths:
        missing = [s for s, p in zip((images_stem, labels_stem), paths) if p is None]
        raise DatasetUnavailable(_mnist_expectation(root, missing))
    images_path, labels_path = paths
    assert images_path is not None and labels_path is not None
    images = read_idx(images_path, ndim=3)
    labels = read_idx(labels_path, ndim=1)
    if images.shape[1:] != (28, 28):
        raise DatasetCorrupt(f"{images_path} holds {images.shape[1:]} images, expected 28x28")
    if len(images) != len(labels):
        raise DatasetCorrupt(
            f"{images_path} has {len(images)} images but {labels_path} has {len(labels)} labels"
        )
    if len(labels) and labels.max() > 9:
        raise DatasetCorrupt(f"{labels_path} holds labels above 9")
    return images, labels


def _mnist_expectation(root: str | None, missing: list[str]) -> str:
    names = ", ".join(f"{s}[.gz]" for s in missing)
    if root is None:
        where = "in a folder given as root"
    else:
        where = f"in {root} (or {os.path.join(root, 'MNIST', 'raw')})"
    return f"data set 'mnist' needs the IDX files {names} {where}"


def _load_mnist(
    *, root: str | None, seed: int, test_fraction: float, num_samples: int | None
) -> tuple[ArrayDataset, ArrayDataset]:
    if root is None:
        raise DatasetUnavailable(_mnist_expectation(None, list(_MNIST_FILES.values())))
    files = _MNIST_FILES
    x_train, y_train = _mnist_split(root, files["train_images"], files["train_labels"])
    x_test, y_test = _mnist_split(root, files["test_images"], files["test_labels"])
    x_train, y_train = _cap(x_train, y_train, num_samples, seed)
    return _make_pair(
        "mnist",
        _to_unit(x_train)[:, None],
        y_train,
        _to_unit(x_test)[:, None],
        y_test,
        10,
    )


# ---------------------------------------------------------------- cifar10


def _numpy_reconstruct() -> Any:
    # Resolve _reconstruct without importing numpy.core, which numpy 2 deprecates.
    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct  # type: ignore[no-redef]
    return _reconstruct


_CIFAR_GLOBALS: dict[tuple[str, str], Any] = {
    ("numpy.core.multiarray", "_reconstruct"): _numpy_reconstruct(),
    ("numpy._core.multiarray", "_reconstruct"): _numpy_reconstruct(),
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
}


class _CifarUnpickler(pickle.Unpickler):
    """Unpickles the CIFAR-10 batches and nothing else: a pickle can name any
    callable, so every global except the three numpy ones an array needs is
    refused before it is imported."""

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _CIFAR_GLOBALS[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"refused global {module}.{name}") from None


_CIFAR_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))
_CIFAR_TEST = "test_batch"
_CIFAR_SUBDIR = "cifar-10-batches-py"


def _read_cifar_batch(path: str) -> tuple[np.ndarray, np.ndarray]:
    try:
        with open(path, "rb") as fh:
            batch = _CifarUnpickler(fh, encoding="bytes").load()
    except (
        pickle.UnpicklingError, EOFError, ValueError, TypeError,
        AttributeError, IndexError, KeyError, OverflowError,
    ) as exc:  # what a garbled pickle stream raises
        raise DatasetCorrupt(f"CIFAR-10 batch {path} is not a valid batch: {exc}") from exc
    if not isinstance(batch, dict):
        raise DatasetCorrupt(f"CIFAR-10 batch {path} holds a {type(batch).__name__}, not a dict")
    # The official batches were pickled by Python 2, so keys come back as bytes.
    data = batch.get(b"data", batch.get("data"))
    labels = batch.get(b"labels", batch.get("labels"))
    if not (
        isinstance(data, np.ndarray)
        and data.dtype == np.uint8
        and data.ndim == 2
        and data.shape[1] == 3072
    ):
        raise DatasetCorrupt(f"CIFAR-10 batch {path}: 'data' must be a uint8 array (N, 3072)")
    labels_arr = np.asarray(labels if labels is not None else [], dtype=np.int64)
    if labels_arr.shape != (data.shape[0],):
        raise DatasetCorrupt(
            f"CIFAR-10 batch {path}: {data.shape[0]} images but labels of shape {labels_arr.shape}"
        )
    if len(labels_arr) and (labels_arr.min() < 0 or labels_arr.max() > 9):
        raise DatasetCorrupt(f"CIFAR-10 batch {path}: labels outside 0..9")
    # Rows are 1024 red, then 1024 green, then 1024 blue bytes, each 32x32 row-major.
    return data.reshape(-1, 3, 32, 32), labels_arr


def _cifar_folder(root: str | None) -> str:
    expected = ", ".join(_CIFAR_TRAIN + (_CIFAR_TEST,))
    if root is not None:
        for folder in (root, os.path.join(root, _CIFAR_SUBDIR)):
            if all(os.path.isfile(os.path.join(folder, f)) for f in _CIFAR_TRAIN + (_CIFAR_TEST,)):
                return folder
        where = f"in {root} or {os.path.join(root, _CIFAR_SUBDIR)}"
    else:
        where = "in a folder given as root (or its cifar-10-batches-py subfolder)"
    raise DatasetUnavailable(
        f"data set 'cifar10' needs the python-version batches {expected} {where}"
    )


def _load_cifar10(
    *, root: str | None, seed: int, test_fraction: float, num_samples: int | None
) -> tuple[ArrayDataset, ArrayDataset]:
    folder = _cifar_folder(root)
    parts = [_read_cifar_batch(os.path.join(folder, f)) for f in _CIFAR_TRAIN]
    x_train = np.concatenate([p[0] for p in parts])
    y_train = np.concatenate([p[1] for p in parts])
    x_test, y_test = _read_cifar_batch(os.path.join(folder, _CIFAR_TEST))
    x_train, y_train = _cap(x_train, y_train, num_samples, seed)
    return _make_pair(
        "cifar10",
        _to_unit(x_train),
        y_train,
        _to_unit(x_test),
        y_test,
        10,
    )


_LOADERS: dict[str, Callable[..., tuple[ArrayDataset, ArrayDataset]]] = {
    "digits": _load_digits,
    "mnist1d": _load_mnist1d,
    "synthetic": _load_synthetic,
    "mnist": _load_mnist,
    "cifar10": _load_cifar10,
}


def split_validation(train: ArrayDataset, fraction: float, seed: int) -> tuple[ArrayDataset, ArrayDataset]:
    """Hold out a seeded ``fraction`` of the training set as a validation set.

    The test set reports accuracy; decisions made during training (the
    agents' update gate, the server's loss weighting) use this split instead,
    so no test sample ever steers training.
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"validation fraction must lie in (0, 1), got {fraction!r}")
    n = len(train)
    n_val = max(1, int(round(n * fraction)))
    if n_val >= n:
        raise ValueError(f"validation fraction {fraction} leaves no training samples out of {n}")
    order = np.random.default_rng([seed, 0x5A1]).permutation(n)
    val_idx, train_idx = np.sort(order[:n_val]), np.sort(order[n_val:])

    def take(idx: np.ndarray, name: str) -> ArrayDataset:
        return ArrayDataset(name=name, x=np.ascontiguousarray(train.x[idx]), y=np.ascontiguousarray(train.y[idx]),
                            num_classes=train.num_classes)

    return take(train_idx, train.name), take(val_idx, f"{train.name}-validation")
