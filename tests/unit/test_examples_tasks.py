"""The examples' tasks (examples/): each passes the start-up check and learns under a few local steps.

The long proof (each reaches its stated target at HL4 under hermes and bsp)
is tests/e2e/test_examples.py; here the tasks are loaded as the server and
an agent load them (resolve_task + check_task) and trained in-process.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hermes.common.config import RunConfig
from hermes.common.task import Task, as_dataset
from hermes.common.task_registry import batch_of, check_task, make_optimizer, resolve_task

STEPS = 60
EXAMPLES = ["image_folder", "regression", "non_iid", "sequence"]


@pytest.fixture(autouse=True)
def example_cache(tmp_path_factory, monkeypatch) -> None:
    # One cache for the module's tests: the image folder is written once, never under $HOME.
    monkeypatch.setenv("HERMES_EXAMPLES_CACHE", str(tmp_path_factory.getbasetemp() / "examples-cache"))


def _task(name: str) -> Task:
    return resolve_task(f"examples.{name}:task", RunConfig())


def _train_batch(task: Task, n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    data = task.train_data if task.train_data is not None else task.local_data("worker-1")  # type: ignore[misc]
    ds = as_dataset(data)
    # Spread over the set: the image folder is sorted by class.
    return batch_of(ds, np.linspace(0, len(ds) - 1, n).astype(int).tolist())


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_passes_the_start_up_check(name: str) -> None:
    task = _task(name)
    config = RunConfig()
    check_task(task, config, role="server")
    check_task(task, config, role="agent", worker="worker-2")


@pytest.mark.parametrize("name", EXAMPLES)
def test_a_few_local_steps_reduce_the_loss(name: str) -> None:
    task = _task(name)
    config = RunConfig()
    torch.manual_seed(0)
    model = task.model()
    optimizer = make_optimizer(task, model.parameters(), config)
    x, y = _train_batch(task)
    with torch.no_grad():
        before = float(task.loss(model(x), y))
    for _ in range(STEPS):
        optimizer.zero_grad()
        task.loss(model(x), y).backward()
        optimizer.step()
    with torch.no_grad():
        after = float(task.loss(model(x), y))
    assert after < 0.7 * before, (before, after)


def test_image_folder_writes_and_reads_pgm_files(tmp_path) -> None:
    from examples.image_folder import ImageFolder, read_pgm, write_pgm

    pixels = np.arange(24, dtype=np.uint8).reshape(4, 6) * 10
    write_pgm(tmp_path / "a.pgm", pixels)
    # A comment line in the header, as other writers (GIMP, netpbm) put one.
    (tmp_path / "b.pgm").write_bytes(b"P5\n# made by hand\n6 4\n255\n" + pixels.tobytes())
    assert np.array_equal(read_pgm(tmp_path / "a.pgm"), pixels)
    assert np.array_equal(read_pgm(tmp_path / "b.pgm"), pixels)

    task = _task("image_folder")
    train, test = as_dataset(task.train_data), as_dataset(task.test_data)  # type: ignore[arg-type]
    assert (len(train), len(test)) == (1437, 360)  # scikit-learn's 1797 digits, 80/20
    image, label = train[0]
    assert image.dtype == torch.float32 and image.shape == (1, 8, 8) and 0.0 <= float(image.min()) <= float(image.max()) <= 1.0
    assert label.dtype == torch.int64
    assert isinstance(train, ImageFolder) and len(list(train.root.glob("*/*.pgm"))) == 1437


def test_regression_r2_is_exact_when_averaged_over_batches() -> None:
    """The server averages a metric over evaluation batches by size: r2 must come out as the whole set's R²."""
    from sklearn.metrics import r2_score

    from examples.regression import r2

    task = _task("regression")
    inputs, targets = (torch.from_numpy(a) for a in task.test_data)  # type: ignore[union-attr, misc]
    torch.manual_seed(0)
    with torch.no_grad():
        out = task.model()(inputs)
    assert out.shape == targets.shape and targets.dtype == torch.float32
    sizes = [32, 32, len(targets) - 64]
    averaged = sum(n * r2(o, t) for n, o, t in zip(sizes, out.split(sizes), targets.split(sizes))) / len(targets)
    assert averaged == pytest.approx(r2_score(targets.numpy(), out.numpy()), abs=1e-5)
    assert task.direction("r2") == "max"


def test_non_iid_devices_hold_different_classes_that_together_cover_all() -> None:
    from examples.non_iid import device_classes

    task = _task("non_iid")
    assert task.train_data is None and task.local_data is not None
    held = {}
    for i in range(1, 5):
        x, y = as_dataset(task.local_data(f"worker-{i}"))[:]  # type: ignore[index]
        held[i] = set(y.tolist())
        assert held[i] == set(device_classes(f"worker-{i}")) and len(held[i]) == 5
    assert set().union(*held.values()) == set(range(10))
    assert len({frozenset(c) for c in held.values()}) == 4
    # Any other name: a stable class set (not Python's per-process hash()).
    assert device_classes("jetson-nano") == device_classes("jetson-nano") and len(device_classes("jetson-nano")) == 5


def test_sequence_inputs_are_int64_token_ids() -> None:
    from examples.sequence import LENGTH, VOCAB

    task = _task("sequence")
    x, y = as_dataset(task.test_data)[0]  # type: ignore[arg-type]
    assert x.dtype == torch.int64 and x.shape == (LENGTH,) and 0 <= int(x.min()) and int(x.max()) < VOCAB
    assert y.dtype == torch.int64
    assert isinstance(make_optimizer(task, task.model().parameters(), RunConfig()), torch.optim.AdamW)
