"""Finding a task by reference, and checking it at start-up.

A reference is ``MODULE:ATTR`` (the current directory is importable, as
under uvicorn), ``path/to/file.py:ATTR``, or a name registered under the
``hermes.tasks`` entry-point group (``builtin`` is registered that way by
this package). ATTR is a :class:`Task` or a callable returning one, called
with no argument or, when it takes one, with the run config (how
``builtin`` reads ``model`` and ``dataset``).

``check_task`` runs the task's code once on a tiny batch before anything
else happens, so that a broken task is one line naming the task and the
field at start-up (server: before binding; agent: before registering), not
a traceback in the middle of a run. Every failure is a :class:`TaskError`.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import logging
import math
import os
import sys
from collections.abc import Iterable, Sequence
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from hermes.common.config import parse_target
from hermes.common.lean_sgd import LeanSGD
from hermes.common.task import Task, TaskError, as_dataset, dataset_len

if TYPE_CHECKING:
    from hermes.common.config import RunConfig

__all__ = ["parse_target", "resolve_task", "check_task", "effective_target", "make_optimizer", "batch_of",
           "example_batch", "installed_tasks", "GROUP"]

log = logging.getLogger(__name__)

GROUP = "hermes.tasks"
# This package's own entries, for a checkout whose installed metadata predates them
# (an editable install made before the entry point was added).
_SHIPPED = {"builtin": "hermes.common.builtin_task:builtin"}
# Samples of the start-up check's batch.
CHECK_BATCH = 4


def installed_tasks() -> list[str]:
    """Names registered under the ``hermes.tasks`` entry-point group (and this package's own)."""
    return sorted({ep.name for ep in entry_points(group=GROUP)} | set(_SHIPPED))


def resolve_task(ref: str | Task, config: RunConfig) -> Task:
    """The Task a reference names; its ``name`` defaults to a short form of the reference.

    Raises TaskError (one line, naming the reference) when it cannot be imported,
    is not a Task, or its factory fails.
    """
    if isinstance(ref, Task):
        return ref if ref.name else dataclasses.replace(ref, name=type(ref).__name__.lower())
    ref = ref.strip()
    obj, attr = _load(ref)
    task = _materialise(obj, ref, attr, config)
    return task if task.name else dataclasses.replace(task, name=default_name(ref))


def default_name(ref: str) -> str:
    """``pkg.mod:attr`` and ``dir/mod.py:attr`` are both ``mod:attr``; an entry-point name is itself."""
    left, sep, attr = ref.rpartition(":")
    if not sep:
        return ref
    stem = Path(left).stem if left.endswith(".py") or "/" in left or os.sep in left else left.rpartition(".")[2]
    return f"{stem}:{attr}"


def _load(ref: str) -> tuple[Any, str]:
    if not ref:
        raise TaskError("task: empty reference; expected MODULE:ATTR, FILE.py:ATTR or an installed task name")
    left, sep, attr = ref.rpartition(":")
    if not sep or (len(left) == 1 and left.isalpha()):  # no colon, or only a drive letter
        return _entry_point(ref), ref
    if not attr:
        raise TaskError(f"task {ref}: nothing after ':'; expected MODULE:ATTR")
    module = _import_file(ref, left) if left.endswith(".py") else _import_module(ref, left)
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            where = left if left.endswith(".py") else f"module {module.__name__!r}"
            raise TaskError(f"task {ref}: {where} has no attribute {attr!r}") from None
    return obj, attr


def _entry_point(ref: str) -> Any:
    found = [ep for ep in entry_points(group=GROUP) if ep.name == ref]
    try:
        if found:
            return found[0].load()
        if ref in _SHIPPED:
            mod, _, attr = _SHIPPED[ref].partition(":")
            return getattr(importlib.import_module(mod), attr)
    except Exception as exc:  # an installed package's own import error: any type
        raise TaskError(f"task {ref}: loading the installed entry point failed: {type(exc).__name__}: {exc}") from None
    raise TaskError(f"task {ref}: not MODULE:ATTR, FILE.py:ATTR or an installed task; "
                    f"installed: {', '.join(installed_tasks())}")


def _import_module(ref: str, name: str) -> Any:
    # Like uvicorn: the directory the command runs in is importable.
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and name.startswith(exc.name):
            raise TaskError(f"task {ref}: no module named {name!r} (run from the folder that holds it, "
                            "or install it)") from None
        raise TaskError(f"task {ref}: importing {name!r} failed: {type(exc).__name__}: {exc}") from None
    except Exception as exc:  # the task module's own code failed: any type
        raise TaskError(f"task {ref}: importing {name!r} failed: {type(exc).__name__}: {exc}") from None


def _import_file(ref: str, path: str) -> Any:
    file = Path(path)
    if not file.is_file():
        raise TaskError(f"task {ref}: no such file {path!r}")
    name = f"hermes_task_{file.stem}"
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise TaskError(f"task {ref}: {path!r} cannot be imported as Python")
    module = importlib.util.module_from_spec(spec)
    # Registered before running it, as an import would: dataclasses and pickling look it up.
    sys.modules[name] = module
    # Its folder is importable, so the file may import its neighbours.
    folder = str(file.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the task file's own code failed: any type
        sys.modules.pop(name, None)
        raise TaskError(f"task {ref}: importing {path!r} failed: {type(exc).__name__}: {exc}") from None
    return module


def _materialise(obj: Any, ref: str, attr: str, config: RunConfig) -> Task:
    if isinstance(obj, Task):
        return obj
    if not callable(obj):
        raise TaskError(f"task {ref}: {attr} is a {type(obj).__name__}, expected a hermes.Task or a "
                        "zero-argument callable returning one")
    try:
        takes_config = _positional_params(obj) == 1
    except (TypeError, ValueError):
        takes_config = False
    try:
        task = obj(config) if takes_config else obj()
    except TaskError:
        raise
    except Exception as exc:  # the task's factory: any type
        raise TaskError(f"task {ref}: calling {attr}() failed: {type(exc).__name__}: {exc}") from None
    if not isinstance(task, Task):
        raise TaskError(f"task {ref}: {attr}() returned a {type(task).__name__}, expected a hermes.Task")
    return task


def _positional_params(fn: Any) -> int:
    """Required positional parameters of ``fn`` (a Task subclass or a class is not a factory of one)."""
    params = inspect.signature(fn).parameters.values()
    return sum(1 for p in params if p.default is p.empty
               and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))


# ---------------------------------------------------------------- optimizer


def make_optimizer(task: Task, params: Iterable[nn.Parameter], config: RunConfig) -> torch.optim.Optimizer:
    """The task's optimizer over ``params``; by default SGD with the run config's lr, momentum, weight decay."""
    if task.optimizer is not None:
        return task.optimizer(params)
    return LeanSGD(params, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay)


# ---------------------------------------------------------------- batches


def batch_of(dataset: Any, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The samples at ``indices`` stacked into (inputs, targets); array-backed datasets are sliced."""
    inputs, targets = getattr(dataset, "inputs", None), getattr(dataset, "targets", None)
    if isinstance(inputs, torch.Tensor) and isinstance(targets, torch.Tensor):
        idx = torch.as_tensor(list(indices), dtype=torch.long)
        return inputs[idx], targets[idx]
    xs, ys = getattr(dataset, "x", None), getattr(dataset, "y", None)
    if isinstance(xs, np.ndarray) and isinstance(ys, np.ndarray):  # hermes.common.datasets.ArrayDataset
        rows = np.asarray(list(indices), dtype=np.int64)
        return torch.from_numpy(np.ascontiguousarray(xs[rows])), torch.from_numpy(np.ascontiguousarray(ys[rows]))
    pairs = [dataset[int(i)] for i in indices]
    return torch.stack([p[0] for p in pairs]), torch.stack([torch.as_tensor(p[1]) for p in pairs])


def example_batch(task: Task, n: int, data: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` (input, target) pairs for probes: ``task.example`` or the first samples of ``data``/the task's."""
    if task.example is not None:
        x, y = task.example(n)
        return x, y
    source = data
    if source is None:
        source = next((d for d in (task.test_data, task.train_data) if d is not None), None)
    if source is None:
        raise TaskError(f"task {task.name}: example: no data to draw a batch from (set example, test_data or "
                        "train_data)")
    ds = as_dataset(source)
    return batch_of(ds, range(min(n, dataset_len(ds))))


# ---------------------------------------------------------------- the start-up check


def check_task(task: Task, config: RunConfig, *, role: str = "server", worker: str = "") -> nn.Module:
    """Run the task's code once on a tiny batch; TaskError names the task and the field that failed.

    ``server`` checks the model, train and test data, loss, metrics and
    optimizer (and the target's metric); ``agent`` what an agent runs: the
    model, its local data when the task has some, loss and optimizer.
    Returns the model it built (the caller may keep it).
    """
    name = task.name or "task"

    def fail(field: str, what: str) -> TaskError:
        return TaskError(f"task {name}: {field}: {what}")

    model = _run(fail, "model", task.model)
    if not isinstance(model, nn.Module):
        raise fail("model", f"returned a {type(model).__name__}, expected a torch.nn.Module")
    local = None
    if role == "server":
        if task.train_data is None and task.local_data is None:
            raise fail("train_data", "None, and the task has no local_data either")
        if task.test_data is None:
            raise fail("test_data", "None: the server evaluates the model on it")
        for field in ("train_data", "test_data"):
            if getattr(task, field) is not None:
                _check_data(fail, field, getattr(task, field))
    elif task.local_data is not None:
        local = _run(fail, "local_data", task.local_data, worker)
        _check_data(fail, "local_data", local)
    x, y = _run(fail, "example" if task.example is not None else "data", example_batch, task, CHECK_BATCH,
                local)
    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
        raise fail("example", f"gave ({type(x).__name__}, {type(y).__name__}), expected a pair of tensors")
    model.train()
    output = _run(fail, "model", model, x)
    loss = _run(fail, "loss", task.loss, output, y)
    if not isinstance(loss, torch.Tensor):
        raise fail("loss", f"returned a {type(loss).__name__}, expected a scalar tensor")
    if loss.dim() != 0:
        raise fail("loss", f"returned shape {tuple(loss.shape)}, expected a scalar")
    if not math.isfinite(float(loss.detach())):
        raise fail("loss", f"is {float(loss.detach())} on a batch of {len(y)} samples, expected a finite number")
    if not loss.requires_grad:
        raise fail("loss", "does not depend on the model's parameters (no gradient flows)")
    if role == "server":
        with torch.no_grad():
            for metric, fn in task.metric_fns.items():
                value = _run(fail, f"metrics[{metric!r}]", fn, output.detach(), y)
                try:
                    float(value)
                except (TypeError, ValueError):
                    raise fail(f"metrics[{metric!r}]", f"returned a {type(value).__name__}, expected a number") from None
        target = effective_target(config)
        # federated_<metric>: the same metric, scored on the devices' held-out data (federated_eval).
        if target is not None and target[0].removeprefix("federated_") not in (*task.metric_fns, "loss"):
            raise TaskError(f"task {name}: target {target[0]}={target[1]:g}: {target[0]!r} is not one of the "
                            f"task's metrics ({', '.join([*task.metric_fns, 'loss'])})")
    optimizer = _run(fail, "optimizer", make_optimizer, task, model.parameters(), config)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise fail("optimizer", f"returned a {type(optimizer).__name__}, expected a torch.optim.Optimizer")
    model.zero_grad(set_to_none=True)
    return model


def _run(fail: Any, field: str, fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except TaskError:
        raise
    except Exception as exc:  # the task's own code: any exception is the task's fault, reported in one line
        raise fail(field, f"raised {type(exc).__name__}: {exc}") from None


def _check_data(fail: Any, field: str, data: Any) -> None:
    try:
        ds = as_dataset(data)
    except (ValueError, TypeError) as exc:
        raise fail(field, str(exc)) from None
    if not hasattr(ds, "__getitem__") or not hasattr(ds, "__len__"):
        raise fail(field, f"is a {type(data).__name__}, expected a map-style Dataset (len and [i]) or a pair of arrays")
    n = _run(fail, field, len, ds)
    if n < 1:
        raise fail(field, "is empty")
    item = _run(fail, field, ds.__getitem__, 0)
    if not (isinstance(item, tuple | list) and len(item) == 2):
        raise fail(field, f"item 0 is a {type(item).__name__}, expected an (input, target) pair")
    if not all(isinstance(t, torch.Tensor) for t in item):
        kinds = ", ".join(type(t).__name__ for t in item)
        raise fail(field, f"item 0 is ({kinds}), expected a pair of tensors")


# ---------------------------------------------------------------- target


def effective_target(config: RunConfig) -> tuple[str, float] | None:
    """The run's target as (metric, value): ``target``, or ``target_accuracy`` as accuracy=VALUE."""
    if config.target is not None:
        return parse_target(config.target)
    if config.target_accuracy is not None:
        return "accuracy", config.target_accuracy
    return None
