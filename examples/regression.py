"""Regression: an MLP with MSE loss and an R² metric on scikit-learn's diabetes set.

    hermes-testbed --task examples.regression:task --clients 4 --profile hl4 --preset hermes --target r2=0.5

Target: test R² 0.4, reached at HL4 with ``--preset hermes`` and with ``--preset bsp`` (ordinary
least squares scores about 0.45 on this split; R² is "higher is better", so ``--target r2=0.5``
stops the run once an evaluation reaches it).

The data ships inside scikit-learn (442 patients, 10 features, a disease-progression score):
no network. Features and target are standardised with the training split's statistics, so the
targets are float32 tensors of shape () and the model's output is squeezed to match.

The task brings its own optimizer: SGD at lr 0.01 with momentum 0.9 (the run config's default
lr 0.05 makes the MSE on 353 samples jump around by ±0.3 R²).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hermes import Task


def diabetes() -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """(train, test) pairs of float32 arrays, standardised with the training split's mean and std."""
    from sklearn.datasets import load_diabetes
    from sklearn.model_selection import train_test_split

    x, y = load_diabetes(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=5)
    mx, sx = x_train.mean(axis=0), x_train.std(axis=0)
    my, sy = y_train.mean(), y_train.std()

    def norm(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return ((a - mx) / sx).astype(np.float32), ((b - my) / sy).astype(np.float32)

    return norm(x_train, y_train), norm(x_test, y_test)


TRAIN, TEST = diabetes()
# R² = 1 - SSE / SST over the whole test set. The server averages a metric over
# evaluation batches weighted by their size; with SST fixed to the test set's
# own variance, that average of 1 - MSE_batch / VAR is exactly the test set's R².
TEST_VARIANCE = float(TEST[1].var())


def r2(output: torch.Tensor, target: torch.Tensor) -> float:
    return 1.0 - float(F.mse_loss(output.float(), target.float())) / TEST_VARIANCE


class MLP(nn.Module):
    def __init__(self, features: int = 10, hidden: int = 32) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(features, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).squeeze(-1)


def sgd(params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.01, momentum=0.9)


task = Task(model=MLP, train_data=TRAIN, test_data=TEST, loss=F.mse_loss, metrics={"r2": r2}, optimizer=sgd,
            name="diabetes-mlp")
