"""Local training on the agent: mixed precision, fp32 master weights, emulated slowdown.

Precision ``auto`` is resolved by measurement (client/precision.py): fp16
autocast on CPU falls back to slow reference convolutions (5-36x slower
than fp32), and bf16 ran anywhere from 2.9x slower to 1.7x faster than fp32
depending on CPU and model (benchmarks/precision.py), so no fixed rule per
device type is right.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hermes.client.steps import StepContext, bind_lr, loss_value
from hermes.common.config import RunConfig
from hermes.common.lean_sgd import LeanSGD
from hermes.common.messages import FederatedReport
from hermes.common.pace import SlowdownMode, StepPacer
from hermes.common.task import LossFn, OptimizerFn, TrainStepFn, TransformFn
from hermes.common.tensors import flatten, load_flat

log = logging.getLogger(__name__)


def _unscaled(loss: torch.Tensor) -> torch.Tensor:
    return loss


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available")
    return dev


def resolve_precision(requested: str, device: torch.device) -> str:
    """A forced precision as given; ``auto`` here is the untimed guess (the agent measures instead,
    client/precision.py): fp16 with loss scaling on CUDA, fp32 elsewhere."""
    if requested == "auto":
        return "fp16" if device.type == "cuda" else "fp32"
    if requested == "fp16" and device.type == "cpu":
        log.warning("fp16 autocast on CPU is 5-36x slower than fp32 here; consider bf16")
    return requested


_AUTOCAST_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class CycleResult:
    samples: int
    steps: int
    loss: float
    compute_seconds: float
    # Seconds in the gradient hook (the all-reduce), outside compute_seconds.
    wait_seconds: float = 0.0
    # The gradient hook said every rank stops after this step.
    stopped: bool = False
    # The answer to a federated evaluation request, scored before this cycle (client/federated_eval.py).
    federated: FederatedReport | None = None


# Called between backward and the optimizer step with the trainable parameters and the
# step's sample count; may replace the gradients (the all-reduce). True: stop after this step.
GradHook = Callable[[Sequence[nn.Parameter], int], bool]


# A pulled model this far from the local one (relative L2 distance) resets the optimizer's state:
# the run config's optimizer_reset_jump, whose default is the one value.
RESET_JUMP: float | None = RunConfig.model_fields["optimizer_reset_jump"].default


class LocalTrainer:
    """The agent's model, loss and optimizer.

    Optimizer state (momentum, Adam's moments) stays on the agent across
    pulls: a pull moves the weights by the other workers' recent updates,
    small next to the distance the moments average over, and restarting
    Adam's bias correction every cycle would make each cycle's first steps
    full-lr steps in every coordinate. It is cleared when the pulled model
    jumps far (``reset_jump``, the run's ``optimizer_reset_jump``) and when the agent registers again. Only
    weights ever leave the agent: the server folds weight changes, whatever
    optimizer produced them, so its aggregation rules hold unchanged.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        lr: float,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        device: torch.device,
        precision: str,
        slowdown: float = 1.0,
        seed: int = 0,
        loss: LossFn = F.cross_entropy,
        optimizer: OptimizerFn | None = None,
        reset_jump: float | None = RESET_JUMP,
        proximal_rho: float = 0.0,
        train_step: TrainStepFn | None = None,
        transform: TransformFn | None = None,
        slowdown_mode: SlowdownMode = "cpu",
        nominal_sample_seconds: float | None = None,
    ) -> None:
        self.device = device
        self.reset_jump = reset_jump
        # FedAsync Sec. 4 (Xie et al. 2019): the worker minimises f(x) + rho/2 ||x - x_tau||^2, x_tau the
        # model it started from (the last one loaded); 0 leaves the task's loss alone.
        self.proximal_rho = float(proximal_rho)
        self._anchor: list[torch.Tensor] | None = None
        # The task's hooks (common/task.py): its own optimizer step, its per-batch transform.
        self.train_step = train_step
        self.transform = transform
        self.global_steps = 0
        self.model = model.to(device)
        self.precision = precision
        self.slowdown = slowdown
        self._pacer = StepPacer(max(1.0, slowdown), slowdown_mode, nominal_sample_seconds=nominal_sample_seconds)
        # The work between cycles (pace_overhead): its CPU seconds and the seconds slept for it, summed.
        self.between_cycles = [0.0, 0.0]
        self.loss_fn = loss
        if optimizer is None:
            # torch.optim.SGD's update without its torch._dynamo import (common/lean_sgd.py: ~1 s of start-up).
            self.optimizer: torch.optim.Optimizer = LeanSGD(
                self.model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
        else:
            self.optimizer = optimizer(self.model.parameters())
        # The run config's lr, which the server's lr policy scales (work.lr); a task's optimizer
        # keeps its own per-group rates, scaled by the same factor.
        self.base_lr = lr
        self._group_lrs = [float(g["lr"]) for g in self.optimizer.param_groups]
        self.state_resets = 0
        # Loss scaling only matters for fp16 gradients on CUDA.
        self.scaler = torch.amp.GradScaler("cuda", enabled=(precision == "fp16" and device.type == "cuda"))
        self.rng = np.random.default_rng(seed)

    def set_lr(self, lr: float) -> None:
        """The server's rate for this cycle: the optimizer's own rates scaled by ``lr / base_lr``."""
        for group, own in zip(self.optimizer.param_groups, self._group_lrs):
            group["lr"] = lr if own == self.base_lr else own * (lr / self.base_lr)

    def reset_state(self) -> None:
        """Forget the optimizer's state (moments, momentum buffers)."""
        self.optimizer.state.clear()
        self.state_resets += 1

    def _autocast(self) -> contextlib.AbstractContextManager[object]:
        dtype = _AUTOCAST_DTYPES.get(self.precision)
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=dtype)

    def train_cycle(self, x: torch.Tensor | np.ndarray, y: torch.Tensor | np.ndarray, batch_size: int, accumulation: int = 1, *,
                    steps: int | None = None, grad_hook: GradHook | None = None) -> CycleResult:
        """Optimizer steps on shuffled chunks of ``batch_size * accumulation`` samples.

        With ``accumulation`` > 1 the gradients of that many micro-batches add
        up into one optimizer step (Chao et al.: w_i micro-batches per
        aggregation), each weighted by its share of the step's samples so the
        step follows the mean gradient over all of them whatever the sizes.

        ``steps`` None: one pass over the assignment. A ``grad_hook`` (the
        collective topology's all-reduce) runs before each optimizer step;
        every rank must take part in the same number of all-reduces, so there
        the run fixes ``steps``, not the samples that arrived: a short (or
        empty) chunk contributes with its real sample count. The fp16 loss
        scaler is not used with a hook: a rank-local skip decision would split
        the replicas; non-finite reduced gradients skip the step on every rank
        alike.

        compute_seconds includes the emulated slowdown: the sleep stands for
        the work a slower device would be doing.
        """
        if accumulation < 1:
            raise ValueError(f"accumulation must be >= 1, got {accumulation}")
        self.model.train()
        order = self.rng.permutation(len(y))
        # The data path hands tensors of the task's dtypes (numpy arrays still work).
        xt, yt = torch.as_tensor(x), torch.as_tensor(y)
        params = [p for p in self.model.parameters() if p.requires_grad]
        step_samples = batch_size * accumulation
        if steps is None:
            steps = -(-len(order) // step_samples)
        scale = self.scaler.scale if grad_hook is None else _unscaled
        if self.proximal_rho and self._anchor is None:
            self._set_anchor()
        total_loss, micro, compute, waited, stopped = 0.0, 0, 0.0, 0.0, False
        cycle_lrs = [float(g["lr"]) for g in self.optimizer.param_groups]
        for step in range(steps):
            chunk = order[step * step_samples:(step + 1) * step_samples]
            t0, cpu0 = time.perf_counter(), time.thread_time()
            if self.train_step is not None:
                # The task's own step; the samples, the step count, the slowdown and the clock stay here.
                self.optimizer.zero_grad(set_to_none=grad_hook is None)
                idx = torch.from_numpy(chunk)
                xb, yb = self.batch(xt[idx], yt[idx], train=True)
                ctx = bind_lr(StepContext(
                    model=self.model, loss_fn=self.loss_fn, device=self.device, precision=self.precision,
                    scaler=self.scaler, autocast=self._autocast, cycle_lrs=cycle_lrs, step_index=step,
                    global_step=self.global_steps, samples=len(chunk), batch_size=batch_size,
                    accumulation=accumulation, grad_hook=grad_hook), self.optimizer)
                total_loss += loss_value(self.train_step(self.model, (xb, yb), self.optimizer, ctx))
                micro += 1
                self.global_steps += 1
                if grad_hook is not None and not ctx.stepped:
                    # Every rank must join every all-reduce: a step that skipped ctx.step still takes part.
                    ctx.stop = grad_hook(params, len(chunk))
                self._emulate_slowdown(t0, cpu0, len(chunk), waited=grad_hook is not None)
                compute += time.perf_counter() - t0
                stopped = ctx.stop
                if stopped:
                    break
                continue
            # The hook reduces into existing gradient tensors.
            self.optimizer.zero_grad(set_to_none=grad_hook is None)
            for start in range(0, len(chunk), batch_size):
                idx = torch.from_numpy(chunk[start:start + batch_size])
                xb, yb = self.batch(xt[idx], yt[idx], train=True)
                with self._autocast():
                    loss = self.loss_fn(self.model(xb), yb)
                # Each micro-batch carries its share of the step's proximal term, so a step adds it once.
                scale((loss + self._proximal(params)) * (len(idx) / len(chunk))).backward()
                total_loss += float(loss.detach())
                micro += 1
            self.global_steps += 1
            if grad_hook is None:
                self.scaler.step(self.optimizer)
                self.scaler.update()
                self._emulate_slowdown(t0, cpu0, len(chunk))
                compute += time.perf_counter() - t0
                continue
            # The all-reduce's waiting is not compute: time it apart.
            self._emulate_slowdown(t0, cpu0, len(chunk))
            compute += time.perf_counter() - t0
            t1 = time.perf_counter()
            stopped = grad_hook(params, len(chunk))
            waited += time.perf_counter() - t1
            if all(p.grad is not None and bool(torch.isfinite(p.grad).all()) for p in params):
                self.optimizer.step()
            if stopped:
                break
        return CycleResult(samples=len(y), steps=steps, loss=total_loss / max(1, micro),
                           compute_seconds=compute, wait_seconds=waited, stopped=stopped)

    def _set_anchor(self) -> None:
        self._anchor = [p.detach().clone() for p in self.model.parameters() if p.requires_grad]

    def _proximal(self, params: Sequence[nn.Parameter]) -> torch.Tensor | float:
        """rho/2 ||x - x_tau||^2 (FedAsync Sec. 4): its gradient is rho (x - x_tau)."""
        if not self.proximal_rho or self._anchor is None:
            return 0.0
        return 0.5 * self.proximal_rho * sum(((p - a) ** 2).sum() for p, a in zip(params, self._anchor))

    @torch.inference_mode()
    def evaluate(self, x: torch.Tensor | np.ndarray, y: torch.Tensor | np.ndarray, batch_size: int = 512) -> float:
        """Mean task loss of the local model on a held-out split (the gate's input)."""
        self.model.eval()
        xt, yt = torch.as_tensor(x), torch.as_tensor(y)
        total = 0.0
        for i in range(0, len(yt), batch_size):
            xb, yb = self.batch(xt[i : i + batch_size], yt[i : i + batch_size], train=False)
            out = self.model(xb).float()
            total += float(self.loss_fn(out, yb)) * len(yb)
        return total / max(1, len(yt))

    def batch(self, x: torch.Tensor, y: torch.Tensor, *, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """A batch on the device, through the task's transform (augmentation when ``train``)."""
        xb, yb = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        return (xb, yb) if self.transform is None else self.transform(xb, yb, train)

    def _emulate_slowdown(self, t0: float, cpu0: float, samples: int, *, waited: bool = False) -> None:
        if self.slowdown > 1.0:
            # The loop sets self.slowdown every cycle (a --slowdown-schedule); the pacer's mode: common/pace.py.
            self._pacer.set_slowdown(self.slowdown)
            # ``waited``: the step's wall time holds a collective's waiting, which is no part of its compute.
            work = self._work_seconds(t0, cpu0)
            pause = self._pacer.sleep_seconds(work, samples, None if waited else time.perf_counter() - t0)
            if pause > 0:
                t1 = time.perf_counter()
                time.sleep(pause)
                self._pacer.slept(pause, time.perf_counter() - t1)

    def pace_overhead(self, t0: float, cpu0: float, waited: float = 0.0) -> None:
        """The device's CPU since ``t0`` outside its training steps (``waited``: seconds of it spent waiting
        for replies), slowed like its training where the slowdown mode says so (common/pace.py: ``nominal``)."""
        if self.slowdown > 1.0:
            self._pacer.set_slowdown(self.slowdown)
            cpu = time.thread_time() - cpu0
            pause = self._pacer.overhead_seconds(cpu, time.perf_counter() - t0 - waited)
            self.between_cycles[0] += cpu
            if pause > 0:
                t1 = time.perf_counter()
                time.sleep(pause)
                self._pacer.slept(pause, time.perf_counter() - t1)
                self.between_cycles[1] += pause

    def _work_seconds(self, t0: float, cpu0: float) -> float:
        """The step's own work, which the emulated slowdown multiplies.

        With one intra-op thread the step runs on this thread, so its CPU
        time excludes time spent descheduled: on a crowded testbed (5
        processes on 2 cores) wall time let a 20 ms deschedule become +107 ms
        on a 5.33x worker (measured cycle-time CV 0.5 vs 0.2 with CPU time).
        With more threads or on CUDA the work is elsewhere: use wall time.
        """
        wall = time.perf_counter() - t0
        if self.device.type == "cpu" and torch.get_num_threads() == 1:
            return min(wall, time.thread_time() - cpu0)
        return wall

    def flat(self) -> torch.Tensor:
        return flatten(self.model).cpu()

    def load(self, flat: torch.Tensor, *, local: torch.Tensor | None = None) -> None:
        """The pulled model's weights; the optimizer's state is kept unless the model jumped far. ``local``: this
        model's flat vector as ``flat()`` gave it, when the caller holds it and nothing changed the model since
        (a push's: the jump is measured from it instead of flattening the model again, one pass over it saved an
        exchange, which the emulation multiplies by the device's slowdown; issue 31)."""
        flat = flat.to(self.device)
        if self.optimizer.state and self.reset_jump is not None:
            here = flatten(self.model) if local is None else local.to(self.device)
            if float(torch.linalg.vector_norm(flat - here)) > self.reset_jump * max(
                    float(torch.linalg.vector_norm(here)), 1e-12):
                log.info("pulled model is far from the local one: optimizer state reset")
                self.reset_state()
        load_flat(self.model, flat)
        if self.proximal_rho:
            self._set_anchor()
