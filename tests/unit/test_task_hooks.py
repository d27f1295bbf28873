"""Task.train_step and Task.transform on the agent's trainer: the framework keeps the budget and the counting."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hermes.client.steps import StepContext
from hermes.client.trainer import LocalTrainer


def _data(n: int = 40) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, 4)).astype(np.float32), rng.integers(0, 3, size=n).astype(np.int64)


def _trainer(**hooks: object) -> LocalTrainer:
    torch.manual_seed(0)
    return LocalTrainer(nn.Linear(4, 3), lr=0.1, device=torch.device("cpu"), precision="fp32", **hooks)  # type: ignore[arg-type]


def test_the_step_hook_gets_each_steps_samples_and_the_framework_counts_them() -> None:
    seen: list[tuple[int, int, int, float]] = []

    def step(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor], opt: torch.optim.Optimizer,
             ctx: StepContext) -> torch.Tensor:
        x, _ = batch
        seen.append((len(x), ctx.step_index, ctx.global_step, ctx.lr))
        loss = ctx.loss(model, *batch)
        ctx.backward(loss)
        ctx.step(opt)
        return loss

    trainer = _trainer(train_step=step)
    x, y = _data(40)
    result = trainer.train_cycle(x, y, batch_size=8, accumulation=2)  # 40 samples, 16 a step: 3 steps
    assert [s[0] for s in seen] == [16, 16, 8] and [s[1] for s in seen] == [0, 1, 2]
    assert result.samples == 40 and result.steps == 3
    trainer.set_lr(0.05)
    trainer.train_cycle(x, y, batch_size=8, steps=2)  # the server's step budget, not the hook's
    assert [s[2] for s in seen] == [0, 1, 2, 3, 4] and seen[-1][3] == 0.05


def test_the_hooks_step_equals_the_frameworks_when_it_does_the_same() -> None:
    def plain(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor], opt: torch.optim.Optimizer,
              ctx: StepContext) -> torch.Tensor:
        loss = ctx.loss(model, *batch)
        ctx.backward(loss)
        ctx.step(opt)
        return loss

    x, y = _data(32)
    ours, theirs = _trainer(), _trainer(train_step=plain)
    a = ours.train_cycle(x, y, batch_size=8)
    b = theirs.train_cycle(x, y, batch_size=8)
    assert torch.equal(ours.flat(), theirs.flat()) and a.loss == pytest.approx(b.loss)


def test_schedule_and_clipping_through_the_context() -> None:
    norms: list[float] = []
    lrs: list[float] = []

    def step(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor], opt: torch.optim.Optimizer,
             ctx: StepContext) -> torch.Tensor:
        ctx.scale_lr(0.5)
        loss = ctx.loss(model, *batch) * 100.0  # large gradients
        ctx.backward(loss)
        ctx.clip_grad_norm(opt, 0.01)
        norms.append(float(torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in model.parameters()]))))
        lrs.append(opt.param_groups[0]["lr"])
        ctx.step(opt)
        return loss

    trainer = _trainer(train_step=step)
    x, y = _data(16)
    trainer.train_cycle(x, y, batch_size=8)
    assert all(n <= 0.01 + 1e-6 for n in norms) and lrs == [0.05, 0.05]
    trainer.set_lr(0.1)  # next cycle: the server's rate again, the schedule on top of it
    assert trainer.optimizer.param_groups[0]["lr"] == 0.1


def test_a_step_hook_that_returns_no_loss_is_one_clear_error() -> None:
    trainer = _trainer(train_step=lambda model, batch, opt, ctx: None)
    x, y = _data(8)
    with pytest.raises(TypeError, match="task.train_step must return the step's loss"):
        trainer.train_cycle(x, y, batch_size=8)


def test_transform_sees_training_batches_with_train_true_and_evaluation_with_false() -> None:
    calls: list[tuple[int, bool]] = []

    def transform(x: torch.Tensor, y: torch.Tensor, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
        calls.append((len(x), train))
        return (x * 0.0 if train else x), y

    trainer = _trainer(transform=transform)
    x, y = _data(24)
    before = trainer.flat().clone()
    trainer.train_cycle(x, y, batch_size=8)
    assert calls == [(8, True)] * 3
    # Inputs zeroed by the transform: only the bias learns, the weights stay.
    assert torch.equal(trainer.flat()[:12], before[:12]) and not torch.equal(trainer.flat()[12:], before[12:])
    loss = trainer.evaluate(x, y, batch_size=16)
    assert calls[3:] == [(16, False), (8, False)]
    with torch.no_grad():
        direct = float(F.cross_entropy(trainer.model(torch.as_tensor(x)), torch.as_tensor(y)))
    assert loss == pytest.approx(direct, rel=1e-5)


def test_the_examples_hooks() -> None:
    from examples.custom_loop import FLOOR, WARMUP_STEPS, augment, lr_factor

    assert lr_factor(0) == pytest.approx(1 / WARMUP_STEPS) and lr_factor(WARMUP_STEPS) == pytest.approx(1.0)
    assert lr_factor(10_000) == pytest.approx(FLOOR)
    x, y = torch.full((4, 64), 0.5), torch.arange(4)
    assert augment(x, y, False)[0] is x
    assert not torch.equal(augment(x, y, True)[0], x)


def test_with_a_gradient_hook_every_step_joins_it_whether_or_not_the_task_stepped() -> None:
    """The collective's all-reduce: one call per step on every rank, even for a step that skipped ctx.step."""
    calls: list[int] = []

    def grad_hook(params: object, samples: int) -> bool:
        calls.append(samples)
        return False

    def step(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor], opt: torch.optim.Optimizer,
             ctx: StepContext) -> torch.Tensor:
        loss = ctx.loss(model, *batch)
        ctx.backward(loss)
        if ctx.step_index != 1:  # the task skips its second step
            ctx.step(opt)
        return loss

    trainer = _trainer(train_step=step)
    x, y = _data(24)
    result = trainer.train_cycle(x, y, batch_size=8, steps=3, grad_hook=grad_hook)
    assert calls == [8, 8, 8] and result.steps == 3 and not result.stopped


def test_a_gradient_hook_that_says_stop_ends_the_cycle_after_that_step() -> None:
    calls: list[int] = []

    def grad_hook(params: object, samples: int) -> bool:
        calls.append(samples)
        return len(calls) == 2

    def step(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor], opt: torch.optim.Optimizer,
             ctx: StepContext) -> torch.Tensor:
        loss = ctx.loss(model, *batch)
        ctx.backward(loss)
        ctx.step(opt)
        return loss

    trainer = _trainer(train_step=step)
    x, y = _data(40)
    result = trainer.train_cycle(x, y, batch_size=8, steps=5, grad_hook=grad_hook)
    assert calls == [8, 8] and result.stopped
