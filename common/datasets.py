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

import logging
import math
import random
from collections.abc import Callable

import numpy as np

from hermes.common import dataset_files
from hermes.common.array_dataset import (
    ArrayDataset,
    DatasetCorrupt,
    DatasetUnavailable,
    cap_training,
    make_pair,
)
from hermes.common.cli_env import package_version
from hermes.common.dataset_cache import cached_arrays
from hermes.common.dataset_files import read_idx

# ArrayDataset, its errors and read_idx are re-exported: callers load data sets from here.
__all__ = ["DATASET_NAMES", "ArrayDataset", "DatasetCorrupt", "DatasetUnavailable", "load_dataset", "make_synthetic",
           "make_synthetic_cifar",
           "read_idx", "split_validation", "validation_indices"]

logger = logging.getLogger(__name__)

DATASET_NAMES = ("digits", "mnist1d", "synthetic", "mnist", "cifar10", "synthetic-cifar")

_MNIST1D_DEFAULT_SAMPLES = 5000
_SYNTHETIC_DEFAULT_SAMPLES = 10000
_SYNTHETIC_CIFAR_DEFAULT_SAMPLES = 12000


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


def _stratified_split(
    y: np.ndarray, test_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's ``train_test_split(stratify=y, random_state=seed)``, index sets sorted, in numpy:
    the same sets, draw for draw (tests/unit/test_datasets_split.py compares them), without
    importing scikit-learn (1.3-2.7 s of every server's start, 2026-11-26)."""
    n = len(y)
    n_test = math.ceil(test_fraction * n)
    n_train = n - n_test
    classes, y_indices, counts = np.unique(y, return_inverse=True, return_counts=True)
    if counts.min() < 2 or n_train < len(classes) or n_test < len(classes):
        raise ValueError(f"cannot split {n} samples of {len(classes)} classes (smallest has {counts.min()}) "
                         f"into {n_train} train and {n_test} test samples by class")
    by_class = np.split(np.argsort(y_indices, kind="stable"), np.cumsum(counts)[:-1])
    rng = np.random.RandomState(seed)
    n_i = _approximate_mode(counts, n_train, rng)
    t_i = _approximate_mode(counts - n_i, n_test, rng)
    train: list[int] = []
    test: list[int] = []
    for i, members in enumerate(by_class):
        shuffled = members.take(rng.permutation(counts[i]), mode="clip")
        train.extend(shuffled[: n_i[i]])
        test.extend(shuffled[n_i[i] : n_i[i] + t_i[i]])
    return np.sort(np.asarray(train, dtype=np.int64)), np.sort(np.asarray(test, dtype=np.int64))


def _approximate_mode(counts: np.ndarray, draws: int, rng: np.random.RandomState) -> np.ndarray:
    """Samples per class for ``draws`` draws: floors of the proportional shares, the rest to the largest
    remainders, ties broken by ``rng`` (scikit-learn's ``_approximate_mode``, same draws)."""
    continuous = counts / counts.sum() * draws
    floored = np.floor(continuous)
    need = int(draws - floored.sum())
    if need > 0:
        remainder = continuous - floored
        for value in np.sort(np.unique(remainder))[::-1]:
            (inds,) = np.where(remainder == value)
            add = min(len(inds), need)
            floored[rng.choice(inds, size=add, replace=False)] += 1
            need -= add
            if need == 0:
                break
    out: np.ndarray = floored.astype(int)
    return out


# ---------------------------------------------------------------- digits


def _load_digits(
    *, root: str | None, seed: int, test_fraction: float, num_samples: int | None
) -> tuple[ArrayDataset, ArrayDataset]:
    data, target = _digits_arrays()
    x = (np.asarray(data, dtype=np.float32) / 16.0).reshape(-1, 1, 8, 8)
    y = np.asarray(target, dtype=np.int64)
    train_idx, test_idx = _stratified_split(y, test_fraction, seed)
    x_train, y_train = cap_training(x[train_idx], y[train_idx], num_samples, seed)
    return make_pair("digits", x_train, y_train, x[test_idx], y[test_idx], 10)


def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """(data, target) of scikit-learn's digits, read from the CSV its package ships without importing
    scikit-learn: that import (scipy and all) took 1.3-2.7 s of the server's ~8 s start (2026-11-26),
    and every server and the testbed load this default data set. Same arrays as ``load_digits``;
    falls back to it where the file is not where scikit-learn 1.x keeps it."""
    import gzip
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("sklearn")  # finds the package; does not import it
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    for root in roots:
        path = Path(root) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            with gzip.open(path, "rt") as f:
                table = np.loadtxt(f, delimiter=",")
            return table[:, :-1], table[:, -1].astype(int)
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return bunch.data, bunch.target


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
    length = int(args.final_seq_length)

    def generate() -> dict[str, np.ndarray]:
        # make_dataset reseeds the global `random` and numpy generators; put them
        # back so loading data does not change anyone else's random stream.
        py_state, np_state = random.getstate(), np.random.get_state()
        try:
            data = make_dataset(args)
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)
        return {"x": np.asarray(data["x"], dtype=np.float32), "y": np.asarray(data["y"]),
                "x_test": np.asarray(data["x_test"], dtype=np.float32), "y_test": np.asarray(data["y_test"]),
                "classes": np.asarray(len(data["templates"]["y"]))}

    # Every generation parameter (defaults included) and the package's version name the file.
    data = cached_arrays("mnist1d", {"args": vars(args), "mnist1d": package_version("mnist1d")}, generate)
    return make_pair(
        "mnist1d", data["x"].reshape(-1, 1, length), data["y"], data["x_test"].reshape(-1, 1, length),
        data["y_test"], int(data["classes"]),
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
    return make_pair(
        "synthetic", x[train_idx], y[train_idx], x[test_idx], y[test_idx], num_classes
    )


def _load_synthetic(
    *, root: str | None, seed: int, test_fraction: float, num_samples: int | None
) -> tuple[ArrayDataset, ArrayDataset]:
    total = _SYNTHETIC_DEFAULT_SAMPLES if num_samples is None else num_samples
    return make_synthetic(total, seed=seed, test_fraction=test_fraction)


# ---------------------------------------------------------------- synthetic-cifar


def make_synthetic_cifar(
    num_samples: int = _SYNTHETIC_CIFAR_DEFAULT_SAMPLES,
    *,
    seed: int = 0,
    test_fraction: float = 0.2,
    noise: float = 1.0,
    distractor: float = 0.7,
) -> tuple[ArrayDataset, ArrayDataset]:
    """CIFAR-shaped (3x32x32, 10 classes) images generated from ``seed``, for the edge-sized model (issue 31).

    Class c owns a grating (an orientation and a frequency) tinted with its own colour and a blob with a second
    colour. An image is its class's grating at a random phase, with the orientation, frequency and colour
    jittered, the blob at a random place, plus a ``distractor``-strong grating of a random other class in a
    random colour and pixel noise of standard deviation ``noise``: a small CNN learns it in a few epochs while a
    linear model stays well short, so the presets' speeds show.
    """
    classes = 10
    if num_samples < 2 * classes:
        raise ValueError(f"synthetic-cifar needs num_samples >= {2 * classes} (two per class), got {num_samples}")
    rng = np.random.default_rng(seed)
    angle_c = (np.arange(classes) + rng.uniform(-0.2, 0.2, classes)) * np.pi / classes
    freq_c = rng.uniform(1.5, 5.0, classes)
    colour_c = rng.normal(0.0, 1.0, (classes, 3))
    blob_colour_c = rng.normal(0.0, 1.0, (classes, 3))
    radius_c = rng.uniform(0.08, 0.2, classes)
    y = rng.permutation(np.arange(num_samples) % classes).astype(np.int64)
    grid = (np.arange(32, dtype=np.float32) + 0.5) / 32
    gx, gy = grid[None, :], grid[:, None]
    x = np.empty((num_samples, 3, 32, 32), dtype=np.float32)
    # In blocks: the float64 temporaries of the whole set would be 8x its size.
    for lo in range(0, num_samples, 1024):
        yb = y[lo : lo + 1024]
        n = len(yb)
        other = (yb + rng.integers(1, classes, n)) % classes

        def grating(c: np.ndarray, jitter: float) -> np.ndarray:
            n = len(c)
            theta = angle_c[c] + rng.normal(0.0, jitter, n)
            freq = freq_c[c] * (1 + rng.normal(0.0, 0.1, n))
            phase = rng.uniform(0.0, 2 * np.pi, n)
            arg = (np.cos(theta)[:, None, None] * gx + np.sin(theta)[:, None, None] * gy) * freq[:, None, None]
            wave: np.ndarray = np.sin(2 * np.pi * arg + phase[:, None, None])
            return wave

        cx, cy = rng.uniform(0.2, 0.8, n), rng.uniform(0.2, 0.8, n)
        blob = np.exp(-((gx - cx[:, None, None]) ** 2 + (gy - cy[:, None, None]) ** 2) / (2 * radius_c[yb] ** 2)[:, None, None])
        colour = colour_c[yb] + rng.normal(0.0, 0.3, (n, 3))
        img = grating(yb, 0.12)[:, None] * colour[:, :, None, None]
        # Faint and with its colour jittered: the blob alone is a linear model's cue.
        img += 0.6 * blob[:, None] * (blob_colour_c[yb] + rng.normal(0.0, 0.7, (n, 3)))[:, :, None, None]
        img += distractor * grating(other, 0.3)[:, None] * rng.normal(0.0, 1.0, (n, 3))[:, :, None, None]
        img += rng.normal(0.0, noise, img.shape)
        x[lo : lo + n] = img
    train_idx, test_idx = _stratified_split(y, test_fraction, seed)
    return make_pair("synthetic-cifar", x[train_idx], y[train_idx], x[test_idx], y[test_idx], classes)


def _load_synthetic_cifar(
    *, root: str | None, seed: int, test_fraction: float, num_samples: int | None
) -> tuple[ArrayDataset, ArrayDataset]:
    total = _SYNTHETIC_CIFAR_DEFAULT_SAMPLES if num_samples is None else num_samples
    return make_synthetic_cifar(total, seed=seed, test_fraction=test_fraction)


# ---------------------------------------------------------------- by name (file-based sets: dataset_files.py)

_LOADERS: dict[str, Callable[..., tuple[ArrayDataset, ArrayDataset]]] = {
    "digits": _load_digits,
    "mnist1d": _load_mnist1d,
    "synthetic": _load_synthetic,
    "mnist": dataset_files.load_mnist,
    "cifar10": dataset_files.load_cifar10,
    "synthetic-cifar": _load_synthetic_cifar,
}


def validation_indices(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train indices, validation indices): a seeded ``fraction`` of ``n`` held out.

    The train indices come in the seeded permutation's order, not sorted: shards are cut from
    consecutive training samples, and a set stored class by class (an image folder) would
    otherwise give one-class shards (the ``hermes`` preset stayed at chance accuracy on the
    ``image_folder`` example). The validation indices stay sorted: never trained on."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"validation fraction must lie in (0, 1), got {fraction!r}")
    n_val = max(1, int(round(n * fraction)))
    if n_val >= n:
        raise ValueError(f"validation fraction {fraction} leaves no training samples out of {n}")
    order = np.random.default_rng([seed, 0x5A1]).permutation(n)
    return order[n_val:], np.sort(order[:n_val])


def split_validation(train: ArrayDataset, fraction: float, seed: int) -> tuple[ArrayDataset, ArrayDataset]:
    """Hold out a seeded ``fraction`` of the training set as a validation set.

    The test set reports accuracy; decisions made during training (the
    agents' update gate, the server's loss weighting) use this split instead,
    so no test sample ever steers training.
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"validation fraction must lie in (0, 1), got {fraction!r}")
    train_idx, val_idx = validation_indices(len(train), fraction, seed)

    def take(idx: np.ndarray, name: str) -> ArrayDataset:
        return ArrayDataset(name=name, x=np.ascontiguousarray(train.x[idx]), y=np.ascontiguousarray(train.y[idx]),
                            num_classes=train.num_classes)

    return take(train_idx, train.name), take(val_idx, f"{train.name}-validation")
