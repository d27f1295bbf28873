"""IID and Dirichlet (Hsu et al. 2019) splits: disjoint, covering, seeded, and as skewed as alpha says."""

from __future__ import annotations

import numpy as np
import pytest

from hermes.sim.partition import dirichlet_split, iid_split


def _labels(n_per_class: int = 200, classes: int = 10) -> np.ndarray:
    return np.random.default_rng(0).permutation(np.repeat(np.arange(classes), n_per_class))


def _check_cover(parts: list[np.ndarray], n: int) -> None:
    joined = np.concatenate(parts)
    assert len(joined) == n and np.array_equal(np.sort(joined), np.arange(n))


def test_iid_split_covers_disjointly_with_sizes_within_one():
    parts = iid_split(1003, 10, seed=1)
    _check_cover(parts, 1003)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    assert all(np.array_equal(a, b) for a, b in zip(parts, iid_split(1003, 10, seed=1), strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(parts, iid_split(1003, 10, seed=2), strict=True))


@pytest.mark.parametrize("alpha", [0.05, 0.1, 0.5, 1.0, 10.0, 100.0])  # Hsu et al. 2019's alphas (Figs. 2-3)
def test_dirichlet_split_covers_disjointly_for_every_alpha_of_the_paper(alpha):
    labels = _labels()
    parts = dirichlet_split(labels, 20, alpha, seed=3)
    _check_cover(parts, len(labels))
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1  # the paper's equal client sizes


def _dominant_share(labels: np.ndarray, parts: list[np.ndarray]) -> float:
    return float(np.mean([np.bincount(labels[p], minlength=10).max() / len(p) for p in parts]))


def test_small_alpha_gives_each_device_about_one_class_and_large_alpha_the_prior():
    # Hsu et al. Sec. 3: alpha -> 0, each client holds one class; alpha -> inf, every client the prior.
    labels = _labels(n_per_class=500)
    skewed = _dominant_share(labels, dirichlet_split(labels, 50, 0.01, seed=0))
    iid_like = _dominant_share(labels, dirichlet_split(labels, 50, 1000.0, seed=0))
    assert skewed > 0.8
    assert iid_like < 0.2  # the prior's 0.1 plus sampling noise on 100 samples
    middle = _dominant_share(labels, dirichlet_split(labels, 50, 1.0, seed=0))
    assert iid_like < middle < skewed


def test_dirichlet_split_is_seeded():
    labels = _labels()
    a, b = dirichlet_split(labels, 7, 0.3, seed=5), dirichlet_split(labels, 7, 0.3, seed=5)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("call", [
    lambda: iid_split(10, 0, 0),
    lambda: iid_split(3, 5, 0),
    lambda: dirichlet_split(np.zeros(10, dtype=int), 2, 0.0, 0),
    lambda: dirichlet_split(np.zeros((5, 2), dtype=int), 2, 1.0, 0),
    lambda: dirichlet_split(np.zeros(3, dtype=int), 5, 1.0, 0),
])
def test_bad_split_arguments_are_refused(call):
    with pytest.raises(ValueError):
        call()
