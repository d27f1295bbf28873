"""The task resolver, the start-up check, fingerprints and target parsing (issue 14)."""

from __future__ import annotations

import dataclasses
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hermes.common.builtin_task import DATASET_SHAPES, BuiltinSplit
from hermes.common.config import ConfigError, build_config, parse_target
from hermes.common.datasets import load_dataset
from hermes.common.lean_sgd import LeanSGD
from hermes.common.task import Task, TaskError, fingerprint
from hermes.common.task_registry import (
    batch_of,
    check_task,
    default_name,
    effective_target,
    installed_tasks,
    make_optimizer,
    resolve_task,
)

FIXTURES = Path(__file__).resolve().parents[1] / "integration" / "task_fixtures.py"
CONFIG = build_config("asp")


def _ref(attr: str) -> str:
    return f"{FIXTURES}:{attr}"


def test_builtin_is_an_installed_task_built_from_the_config():
    assert "builtin" in installed_tasks()
    task = resolve_task("builtin", build_config("asp", model="mlp", dataset="digits"))
    assert task.name == "builtin" and isinstance(task.train_data, BuiltinSplit)
    model = check_task(task, CONFIG)
    assert isinstance(model, nn.Module)
    # The model's shape is known without reading data; the data, read on use, agrees with it.
    train, _ = load_dataset("digits")
    assert DATASET_SHAPES["digits"] == (train.input_shape, train.num_classes)
    x, y = batch_of(task.train_data, [0, 1, 2])
    assert x.shape == (3, *train.input_shape) and y.dtype == torch.int64


def test_a_file_reference_resolves_and_names_the_task_by_its_file_and_attribute():
    task = resolve_task(_ref("regression"), CONFIG)
    assert task.name == "tiny-regression"  # set by the task itself
    assert default_name(f"{FIXTURES}:regression") == "task_fixtures:regression"
    assert default_name("examples.reg:task") == "reg:task" and default_name("builtin") == "builtin"
    other = resolve_task(_ref("other"), CONFIG)  # a zero-argument factory
    assert other.name == "wider-regression"
    assert fingerprint(task.model()) != fingerprint(other.model())
    # The fingerprint depends on names, shapes and dtypes, not on values.
    assert fingerprint(task.model()) == fingerprint(task.model())


def test_a_module_reference_imports_from_the_current_directory(tmp_path, monkeypatch):
    (tmp_path / "mytask_mod.py").write_text(textwrap.dedent("""
        import torch
        from torch import nn
        from hermes import Task

        def make(config):
            # A factory taking the run config: called with it.
            data = (torch.randn(16, 3), torch.randint(0, 2, (16,)))
            return Task(model=lambda: nn.Linear(3, 2), train_data=data, test_data=data,
                        metrics={"seed": lambda o, t: float(config.seed)})
    """))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    try:
        task = resolve_task("mytask_mod:make", build_config("asp", seed=7))
    finally:
        sys.modules.pop("mytask_mod", None)
    assert task.name == "mytask_mod:make"
    assert task.metric_fns["seed"](torch.zeros(1), torch.zeros(1)) == 7.0
    check_task(task, CONFIG)


def test_a_task_object_passes_through_with_a_name():
    task = Task(model=lambda: nn.Linear(2, 2))
    assert resolve_task(task, CONFIG).name == "task"
    named = dataclasses.replace(task, name="mine")
    assert resolve_task(named, CONFIG) is named


@pytest.mark.parametrize(("ref", "expected"), [
    ("no_such_module_xyz:task", "task no_such_module_xyz:task: no module named 'no_such_module_xyz'"),
    ("not_installed_name", "task not_installed_name: not MODULE:ATTR, FILE.py:ATTR or an installed task; "
                           "installed: builtin"),
    ("/no/such/file.py:task", "task /no/such/file.py:task: no such file '/no/such/file.py'"),
    ("", "task: empty reference"),
])
def test_references_that_cannot_be_loaded_are_one_line_errors(ref, expected):
    with pytest.raises(TaskError) as err:
        resolve_task(ref, CONFIG)
    assert str(err.value).startswith(expected) and "\n" not in str(err.value)


def test_wrong_types_and_missing_attributes_name_the_reference():
    with pytest.raises(TaskError, match=r"not_a_task is a int, expected a hermes.Task"):
        resolve_task(_ref("not_a_task"), CONFIG)
    with pytest.raises(TaskError, match=r"task_fixtures.py has no attribute 'nope'"):
        resolve_task(_ref("nope"), CONFIG)


@pytest.mark.parametrize(("attr", "field", "what"), [
    ("non_tensor_data", "train_data", "item 0 is (list, float), expected a pair of tensors"),
    ("vector_loss", "loss", "returned shape (4,), expected a scalar"),
    ("throwing_metric", "metrics['boom']", "raised RuntimeError: metric exploded"),
])
def test_check_task_names_the_task_and_the_field(attr, field, what):
    task = resolve_task(_ref(attr), CONFIG)
    with pytest.raises(TaskError) as err:
        check_task(task, CONFIG)
    assert str(err.value) == f"task tiny-regression: {field}: {what}"


def test_check_task_catches_models_losses_and_optimizers_of_the_wrong_kind():
    good = resolve_task(_ref("regression"), CONFIG)
    cases = {
        "model: returned a str, expected a torch.nn.Module": dataclasses.replace(good, model=lambda: "mlp"),
        "loss: is nan": dataclasses.replace(good, loss=lambda o, t: (o * float("nan")).mean()),
        "loss: returned a float, expected a scalar tensor": dataclasses.replace(good, loss=lambda o, t: 1.0),
        "optimizer: returned a list, expected a torch.optim.Optimizer":
            dataclasses.replace(good, optimizer=lambda params: list(params)),
        "test_data: None": dataclasses.replace(good, test_data=None),
        "model: raised RuntimeError": dataclasses.replace(good, model=lambda: nn.Linear(3, 1)),
    }
    for expected, task in cases.items():
        with pytest.raises(TaskError) as err:
            check_task(task, CONFIG)
        assert str(err.value).startswith(f"task tiny-regression: {expected}"), err.value


def test_an_agent_checks_what_it_runs_and_not_the_servers_data():
    task = resolve_task(_ref("regression"), CONFIG)
    # No test data is what the server would refuse; an agent only needs a batch to run the loss on.
    agent_side = dataclasses.replace(task, test_data=None, example=lambda n: (torch.randn(n, 8), torch.randn(n)))
    check_task(agent_side, CONFIG, role="agent")
    with pytest.raises(TaskError, match="test_data: None"):
        check_task(agent_side, CONFIG)
    local = dataclasses.replace(task, local_data=lambda worker: [(1, 2)])
    with pytest.raises(TaskError, match=r"^task tiny-regression: local_data: item 0 is \(int, int\), expected a pair of tensors$"):
        check_task(local, CONFIG, role="agent", worker="w1")


def test_the_target_must_be_a_metric_of_the_task():
    task = resolve_task(_ref("regression"), CONFIG)
    check_task(task, build_config("asp", target="r2=0.9"))
    check_task(task, build_config("asp", target="loss=0.01"))
    with pytest.raises(TaskError, match=r"target accuracy=0.9: 'accuracy' is not one of the task's metrics \(r2, mse, loss\)"):
        check_task(task, build_config("asp", target_accuracy=0.9))


def test_parse_target_and_the_accuracy_shorthand():
    assert parse_target("r2=0.8") == ("r2", 0.8)
    assert parse_target(" loss = 1e-3") == ("loss", 0.001)
    for bad in ("r2", "=0.5", "r2=high", "r2=nan"):
        with pytest.raises(ValueError, match="target"):
            parse_target(bad)
    assert effective_target(build_config("asp", target="r2=0.80")) == ("r2", 0.8)
    assert effective_target(build_config("asp", target_accuracy=0.9)) == ("accuracy", 0.9)
    assert effective_target(build_config("asp")) is None
    with pytest.raises(ConfigError, match="both set"):
        build_config("asp", target="r2=0.8", target_accuracy=0.9)
    with pytest.raises(ConfigError, match="target: .*expected METRIC=VALUE"):
        build_config("asp", target="r2")


def test_budgets_are_config_keys_with_bounds():
    cfg = build_config("asp", max_epochs=1.5, max_updates=10, max_seconds=30, task="pkg.mod:task")
    assert (cfg.max_epochs, cfg.max_updates, cfg.max_seconds, cfg.task) == (1.5, 10, 30.0, "pkg.mod:task")
    for bad in ({"max_epochs": 0}, {"max_updates": -1}, {"max_seconds": 0}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            build_config("asp", **bad)


def test_default_optimizer_is_sgd_from_the_config_and_a_tasks_own_is_used():
    model = nn.Linear(2, 2)
    cfg = build_config("asp", lr=0.2, momentum=0.5)
    sgd = make_optimizer(Task(model=lambda: model), model.parameters(), cfg)
    assert isinstance(sgd, LeanSGD) and isinstance(sgd, torch.optim.Optimizer)
    assert (sgd.param_groups[0]["lr"], sgd.param_groups[0]["momentum"]) == (0.2, 0.5)
    adam = make_optimizer(Task(model=lambda: model, optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3)),
                          model.parameters(), cfg)
    assert isinstance(adam, torch.optim.AdamW)


def test_trainer_uses_the_task_loss_and_keeps_optimizer_state_across_small_pulls():
    from hermes.client.trainer import LocalTrainer

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 1), nn.Flatten(0))
    trainer = LocalTrainer(model, lr=0.05, device=torch.device("cpu"), precision="fp32", loss=F.mse_loss,
                           optimizer=lambda p: torch.optim.AdamW(p, lr=0.01))
    x = torch.randn(64, 4).numpy()
    y = (x.sum(axis=1)).astype("float32")  # float targets: regression
    result = trainer.train_cycle(x, y, batch_size=16)
    assert result.steps == 4 and result.loss > 0
    assert trainer.optimizer.state  # Adam's moments exist
    flat = trainer.flat()
    trainer.load(flat + 1e-4)  # a small pull keeps them
    assert trainer.optimizer.state and trainer.state_resets == 0
    trainer.load(flat * 10)  # a far jump resets them
    assert not trainer.optimizer.state and trainer.state_resets == 1
    # The server's lr policy scales the task optimizer's own rate by work.lr / config.lr.
    trainer.set_lr(0.025)
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(0.005)
    with torch.no_grad():
        expected = float(F.mse_loss(model(torch.from_numpy(x)), torch.from_numpy(y)))
    assert trainer.evaluate(x, y) == pytest.approx(expected, rel=1e-5)
