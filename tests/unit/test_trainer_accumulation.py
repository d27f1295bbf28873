"""LocalTrainer gradient accumulation (Chao et al.: w_i micro-batches per optimizer step).

One step over w micro-batches must follow the mean gradient of all their
samples, whatever the micro-batch sizes: that is what makes a worker with
(mbs, accumulation) = (8, 4) equivalent to one with batch 32.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from hermes.client.trainer import LocalTrainer
from hermes.common.models import build_model

DIGITS_SHAPE = (1, 8, 8)  # sklearn digits, as common/datasets.py loads them


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # Tiny models: one intra-op thread is fastest and does not fight other processes for the
    # two cores (as the agents run: see LocalTrainer._work_seconds).
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def data(n: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, *DIGITS_SHAPE)).astype(np.float32)
    y = rng.integers(0, 10, size=n).astype(np.int64)
    return x, y


def model(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(name, input_shape=DIGITS_SHAPE, num_classes=10)


def trainer(m: torch.nn.Module, *, momentum: float = 0.0, seed: int = 0) -> LocalTrainer:
    return LocalTrainer(copy.deepcopy(m), lr=0.1, momentum=momentum, weight_decay=0.0,
                        device=torch.device("cpu"), precision="fp32", seed=seed)


def assert_same_weights(a: LocalTrainer, b: LocalTrainer, moved_from: torch.Tensor) -> None:
    fa, fb = a.flat(), b.flat()
    # The step really moved the weights (so equality below is not trivial) ...
    assert (fa - moved_from).abs().max() > 1e-4
    # ... and both trainers moved them the same way, to float32 tolerance.
    torch.testing.assert_close(fa, fb, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["mlp", "cnn"])
@pytest.mark.parametrize("n,batch,acc,micro", [
    (32, 8, 4, "8, 8, 8, 8"),
    (30, 8, 4, "8, 8, 8, 6"),  # unequal micro-batches: each weighs by its share of the step
    (27, 5, 6, "5, 5, 5, 5, 5, 2"),
])
def test_one_accumulated_step_equals_one_full_batch_step(name, n, batch, acc, micro):
    m = model(name)
    x, y = data(n)
    acc_trainer, full_trainer = trainer(m), trainer(m)
    start = acc_trainer.flat().clone()
    r = acc_trainer.train_cycle(x, y, batch_size=batch, accumulation=acc)
    # The reference: one plain SGD step on all n samples (the gradient of their union).
    f = full_trainer.train_cycle(x, y, batch_size=n)
    assert (r.steps, r.samples, f.steps) == (1, n, 1)
    assert_same_weights(acc_trainer, full_trainer, start)


def test_unweighted_micro_batches_would_differ():
    # Guard on the test above: with an unequal split, the mean of the micro-batch means is
    # not the full-batch mean, so the (30, 8, 4) case really checks the share weighting.
    m = model("mlp")
    x, y = data(30)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)

    def grad(weights: list[float], chunks: list[slice]) -> torch.Tensor:
        mm = copy.deepcopy(m)
        mm.zero_grad()
        for wgt, sl in zip(weights, chunks):
            (torch.nn.functional.cross_entropy(mm(xt[sl]), yt[sl]) * wgt).backward()
        return torch.cat([p.grad.flatten() for p in mm.parameters()])

    chunks = [slice(0, 8), slice(8, 16), slice(16, 24), slice(24, 30)]
    full = grad([1.0], [slice(0, 30)])
    weighted = grad([8 / 30, 8 / 30, 8 / 30, 6 / 30], chunks)
    plain = grad([0.25] * 4, chunks)
    torch.testing.assert_close(weighted, full, rtol=1e-5, atol=1e-6)
    assert (plain - full).abs().max() > 1e-4


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_accumulation_matches_plain_batches_over_several_steps(momentum):
    # Same seed -> same shuffle: (8 x 4) steps see exactly the samples of plain 32-sample
    # steps, in the same order, including a short last step (100 = 32 + 32 + 32 + 4).
    m = model("cnn")
    x, y = data(100)
    a, b = trainer(m, momentum=momentum), trainer(m, momentum=momentum)
    start = a.flat().clone()
    ra = a.train_cycle(x, y, batch_size=8, accumulation=4)
    rb = b.train_cycle(x, y, batch_size=32)
    assert ra.steps == rb.steps == 4
    assert_same_weights(a, b, start)


@pytest.mark.parametrize("n,batch,acc,steps", [
    (32, 8, 4, 1),
    (33, 8, 4, 2),
    (100, 8, 4, 4),
    (64, 32, 1, 2),
    (10, 8, 1, 2),
    (7, 8, 3, 1),
])
def test_steps_are_ceil_samples_over_step_batch(n, batch, acc, steps):
    t = trainer(model("mlp"))
    x, y = data(n)
    r = t.train_cycle(x, y, batch_size=batch, accumulation=acc)
    assert r.steps == steps == -(-n // (batch * acc))
    assert r.samples == n
    assert np.isfinite(r.loss) and r.loss > 0
    assert r.compute_seconds > 0


@pytest.mark.parametrize("acc", [0, -1])
def test_accumulation_below_one_is_refused(acc):
    t = trainer(model("mlp"))
    x, y = data(8)
    before = t.flat().clone()
    with pytest.raises(ValueError, match="accumulation must be >= 1"):
        t.train_cycle(x, y, batch_size=8, accumulation=acc)
    assert torch.equal(t.flat(), before)  # refused before touching the model
