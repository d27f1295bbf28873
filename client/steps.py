"""What a task's own ``train_step`` hook is handed: the framework's precision, loss scaling and gradient hook.

The agent still owns the cycle: which samples, how many steps (the
server's cycle budget), the slowdown emulation, the counting and the push.
The user's step owns what happens inside one optimizer step: the forward
pass, extra terms in the loss, gradient clipping, a learning-rate schedule.
It goes through this context for the parts the framework must keep in
charge of:

- ``ctx.autocast()`` / ``ctx.loss(model, x, y)``: the precision the agent
  measured (client/precision.py);
- ``ctx.backward(loss)``: the fp16 loss scaler where one is used;
- ``ctx.clip_grad_norm(params, max_norm)``: clipping after the scaler's
  unscale, as ``torch.amp`` requires;
- ``ctx.step(optimizer)``: the collective topology's all-reduce (between
  backward and the step, on every rank alike), then the step through the
  scaler;
- ``ctx.scale_lr(factor)``: a schedule relative to the server's rate for
  this cycle (the lr policy's, OmniLearn Eq. 5b), never replacing it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from hermes.common.task import LossFn

log = logging.getLogger(__name__)

# (trainable parameters, the step's samples) -> stop after this step (client/trainer.py GradHook).
_GradHook = Callable[[Sequence[nn.Parameter], int], bool]


@dataclass
class StepContext:
    """One optimizer step of the agent, as the task's ``train_step`` sees it."""

    model: nn.Module
    loss_fn: LossFn
    device: torch.device
    precision: str
    scaler: torch.amp.GradScaler
    autocast: Callable[[], contextlib.AbstractContextManager[object]]
    # This cycle's rate of each parameter group, as the server set it (client/trainer.py set_lr).
    cycle_lrs: list[float]
    step_index: int  # the step's index in this cycle
    global_step: int  # steps this agent has taken since it started (for schedules)
    samples: int  # samples in this step (the framework counts them)
    batch_size: int
    accumulation: int
    grad_hook: _GradHook | None = None
    stepped: bool = False
    stop: bool = False
    _unscaled: set[int] = field(default_factory=set)

    @property
    def lr(self) -> float:
        """The server's rate for this cycle (the first parameter group's)."""
        return self.cycle_lrs[0] if self.cycle_lrs else 0.0

    def loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The task's loss of ``model`` on ``(x, y)``, forward under the agent's precision."""
        with self.autocast():
            return self.loss_fn(model(x), y)

    def micro_batches(self, x: torch.Tensor, y: torch.Tensor) -> Iterator[tuple[torch.Tensor, torch.Tensor, float]]:
        """The step's samples in micro-batches of ``batch_size`` with each one's share of the step (accumulation)."""
        n = len(y)
        for start in range(0, n, self.batch_size):
            xb, yb = x[start:start + self.batch_size], y[start:start + self.batch_size]
            yield xb, yb, len(yb) / max(1, n)

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, through the fp16 loss scaler where the agent uses one."""
        if self.grad_hook is None:
            self.scaler.scale(loss).backward()
        else:  # the collective does not scale (client/trainer.py train_cycle)
            loss.backward()

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Bring scaled gradients back to their true size (before clipping or reading them); once per step."""
        if self.grad_hook is None and self.scaler.is_enabled() and id(optimizer) not in self._unscaled:
            self.scaler.unscale_(optimizer)
            self._unscaled.add(id(optimizer))

    def clip_grad_norm(self, optimizer: torch.optim.Optimizer, max_norm: float) -> float:
        """Clip the gradients of ``optimizer``'s parameters to ``max_norm`` (unscaled first); their norm before."""
        self.unscale(optimizer)
        params: Iterable[torch.Tensor] = [p for g in optimizer.param_groups for p in g["params"]]
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))

    def scale_lr(self, factor: float) -> None:
        """Set every group's rate to this cycle's rate times ``factor`` (a schedule on top of the server's rate)."""
        raise NotImplementedError  # bound by the trainer to its optimizer (set in make_context)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """The optimizer step: the gradient hook first (the all-reduce), then the step through the scaler."""
        self.stepped = True
        if self.grad_hook is not None:
            params = [p for p in self.model.parameters() if p.requires_grad]
            self.stop = self.grad_hook(params, self.samples)
            # Non-finite reduced gradients skip the step on every rank alike (client/trainer.py).
            if all(p.grad is not None and bool(torch.isfinite(p.grad).all()) for p in params):
                optimizer.step()
            return
        self.scaler.step(optimizer)
        self.scaler.update()


def bind_lr(ctx: StepContext, optimizer: torch.optim.Optimizer) -> StepContext:
    """``ctx.scale_lr`` acting on ``optimizer``'s groups."""

    def scale_lr(factor: float) -> None:
        for group, lr in zip(optimizer.param_groups, ctx.cycle_lrs):
            group["lr"] = lr * factor

    ctx.scale_lr = scale_lr  # type: ignore[method-assign]
    return ctx


def loss_value(loss: object) -> float:
    """The step's loss as the hook returned it (a tensor or a number); a TypeError naming the hook otherwise."""
    if isinstance(loss, torch.Tensor) and loss.numel() == 1:
        return float(loss.detach())
    if isinstance(loss, (int, float)):
        return float(loss)
    raise TypeError(f"task.train_step must return the step's loss (a scalar tensor or a number), got {type(loss).__name__}")
