"""The built-in data sets' train/test split: our numpy stratified split gives scikit-learn's sets exactly,
so reading the data sets without importing scikit-learn changed no run's data."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from sklearn.model_selection import train_test_split

from hermes.common.datasets import _digits_arrays, _stratified_split


def _sklearn(y: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    tr, te = train_test_split(np.arange(len(y)), test_size=fraction, stratify=y, random_state=seed, shuffle=True)
    return np.sort(tr), np.sort(te)


LABELS = {
    "digits": _digits_arrays()[1],
    "unbalanced": np.repeat(np.arange(5), [3, 17, 40, 2, 9]),
    "ties": np.repeat(np.arange(7), 5),
    "strings": np.array(list("abcabcabcaab")),
}


# (12 string labels at 0.2 would leave fewer test samples than classes: both refuse that.)
CASES = [(labels, fraction) for labels in sorted(LABELS) for fraction in (0.2, 0.25, 0.5, 0.37)
         if not (labels == "strings" and fraction < 0.25)]


@pytest.mark.parametrize(("labels", "fraction"), CASES)
@pytest.mark.parametrize("seed", [0, 1, 7, 123])
def test_the_split_is_scikit_learns(labels, fraction, seed):
    y = LABELS[labels]
    ours, theirs = _stratified_split(y, fraction, seed), _sklearn(y, fraction, seed)
    assert np.array_equal(ours[0], theirs[0]) and np.array_equal(ours[1], theirs[1])
    assert len(np.intersect1d(ours[0], ours[1])) == 0 and len(ours[0]) + len(ours[1]) == len(y)


def test_a_split_that_cannot_be_stratified_is_refused_in_one_line():
    with pytest.raises(ValueError, match="cannot split 4 samples of 3 classes"):
        _stratified_split(np.array([0, 0, 1, 2]), 0.5, 0)


def test_digits_are_scikit_learns_and_loading_them_imports_no_scikit_learn():
    from sklearn.datasets import load_digits

    data, target = _digits_arrays()
    bunch = load_digits()
    assert np.array_equal(data, bunch.data) and np.array_equal(target, bunch.target)
    code = ("import sys; from hermes.common.datasets import load_dataset; load_dataset('digits', seed=0); "
            "print('sklearn' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
