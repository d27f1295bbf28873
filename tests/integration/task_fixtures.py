"""Tasks for the Task API tests, named as ``path/to/task_fixtures.py:ATTR`` by the servers and agents they start.

``regression``: a tiny MLP fitting a noisy linear function (MSE loss, an R² metric,
AdamW), the kind of task the built-in models cannot express. The rest are broken on
purpose, one field each.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hermes import Task

FEATURES = 8


def _data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    w = np.random.default_rng(99).normal(size=FEATURES)
    x = rng.normal(size=(n, FEATURES)).astype(np.float32)
    y = (x @ w + 0.1 * rng.normal(size=n)).astype(np.float32)
    return x, y


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, 1), nn.Flatten(0))


def mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(output, target)


def r2(output: torch.Tensor, target: torch.Tensor) -> float:
    total = float(((target - target.mean()) ** 2).sum())
    return 1.0 - float(((target - output) ** 2).sum()) / max(total, 1e-12)


regression = Task(
    model=_mlp, train_data=_data(1024, 0), test_data=_data(256, 1), loss=mse, metrics={"r2": r2, "mse": lambda o, t: float(F.mse_loss(o, t))},
    optimizer=lambda params: torch.optim.AdamW(params, lr=0.01), name="tiny-regression",
)


def other():
    """Another architecture under another name: an agent holding it must be refused."""
    wide = dataclasses.replace(regression, model=lambda: nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(),
                                                                        nn.Linear(32, 1), nn.Flatten(0)))
    return dataclasses.replace(wide, name="wider-regression")


not_a_task = 42


class _Lists(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int):
        return [0.0] * FEATURES, 1.0


non_tensor_data = dataclasses.replace(regression, train_data=_Lists())
vector_loss = dataclasses.replace(regression, loss=lambda o, t: F.mse_loss(o, t, reduction="none"))


def _boom(output: torch.Tensor, target: torch.Tensor) -> float:
    raise RuntimeError("metric exploded")


throwing_metric = dataclasses.replace(regression, metrics={"r2": r2, "boom": _boom})


def probe_ports():
    """A task factory that looks, while the server loads it, whether anything listens on the ports named in
    TASK_PROBE_PORTS (host:port,...), writes what it saw to TASK_PROBE_OUT, and then fails."""
    import json
    import os
    import socket

    seen = {}
    for spec in os.environ["TASK_PROBE_PORTS"].split(","):
        host, port = spec.rsplit(":", 1)
        with socket.socket() as s:
            seen[spec] = s.connect_ex((host, int(port))) == 0
    with open(os.environ["TASK_PROBE_OUT"], "w") as f:
        json.dump(seen, f)
    raise RuntimeError("probe done")
