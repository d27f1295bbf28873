"""File-based data sets: MNIST (IDX files) and CIFAR-10 (python batches), read from a local folder.

``datasets.load_dataset`` dispatches to ``load_mnist``/``load_cifar10``;
readers of untrusted files with their format checks, building their pairs
with ``array_dataset``. Nothing here
touches the network.
"""

from __future__ import annotations

import gzip
import math
import os
import pickle
import zlib
from collections.abc import Callable
from typing import Any, BinaryIO

import numpy as np

from hermes.common.array_dataset import (
    ArrayDataset,
    DatasetCorrupt,
    DatasetUnavailable,
    cap_training,
    make_pair,
    to_unit,
)

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


def load_mnist(
    *, root: str | None, seed: int, test_fraction: float, num_samples: int | None
) -> tuple[ArrayDataset, ArrayDataset]:
    if root is None:
        raise DatasetUnavailable(_mnist_expectation(None, list(_MNIST_FILES.values())))
    files = _MNIST_FILES
    x_train, y_train = _mnist_split(root, files["train_images"], files["train_labels"])
    x_test, y_test = _mnist_split(root, files["test_images"], files["test_labels"])
    x_train, y_train = cap_training(x_train, y_train, num_samples, seed)
    return make_pair(
        "mnist",
        to_unit(x_train)[:, None],
        y_train,
        to_unit(x_test)[:, None],
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
        f"data set 'cifar10' needs the binary-version batches (cifar-10-batches-bin: data_batch_1.bin ... "
        f"test_batch.bin) or the python-version batches {expected} {where}"
    )


# The binary version (cifar-10-batches-bin): records of 1 label byte and 3072 pixel bytes (1024 red, 1024 green,
# 1024 blue, each 32x32 row-major), 10,000 a file. Read first where present: no pickle is opened at all.
_CIFAR_BIN_SUBDIR = "cifar-10-batches-bin"
_CIFAR_BIN_TRAIN = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
_CIFAR_BIN_TEST = "test_batch.bin"
_CIFAR_RECORD = 1 + 3072


def _read_cifar_bin(path: str) -> tuple[np.ndarray, np.ndarray]:
    raw = np.fromfile(path, dtype=np.uint8)
    if raw.size == 0 or raw.size % _CIFAR_RECORD:
        raise DatasetCorrupt(f"CIFAR-10 binary batch {path}: {raw.size} bytes is not a whole number of "
                             f"{_CIFAR_RECORD}-byte records (1 label byte + 3072 pixel bytes)")
    records = raw.reshape(-1, _CIFAR_RECORD)
    labels = records[:, 0].astype(np.int64)
    if labels.max() > 9:
        raise DatasetCorrupt(f"CIFAR-10 binary batch {path}: label {int(labels.max())} outside 0..9")
    return records[:, 1:].reshape(-1, 3, 32, 32), labels


def _cifar_bin_folder(root: str | None) -> str | None:
    if root is None:
        return None
    for folder in (root, os.path.join(root, _CIFAR_BIN_SUBDIR)):
        if all(os.path.isfile(os.path.join(folder, f)) for f in _CIFAR_BIN_TRAIN + (_CIFAR_BIN_TEST,)):
            return folder
    return None


def load_cifar10(
    *, root: str | None, seed: int, test_fraction: float, num_samples: int | None
) -> tuple[ArrayDataset, ArrayDataset]:
    binary = _cifar_bin_folder(root)
    if binary is not None:
        parts = [_read_cifar_bin(os.path.join(binary, f)) for f in _CIFAR_BIN_TRAIN]
        x_test, y_test = _read_cifar_bin(os.path.join(binary, _CIFAR_BIN_TEST))
    else:
        folder = _cifar_folder(root)
        parts = [_read_cifar_batch(os.path.join(folder, f)) for f in _CIFAR_TRAIN]
        x_test, y_test = _read_cifar_batch(os.path.join(folder, _CIFAR_TEST))
    x_train = np.concatenate([p[0] for p in parts])
    y_train = np.concatenate([p[1] for p in parts])
    x_train, y_train = cap_training(x_train, y_train, num_samples, seed)
    return make_pair(
        "cifar10",
        to_unit(x_train),
        y_train,
        to_unit(x_test),
        y_test,
        10,
    )
