"""Local training on the agent: mixed precision, fp32 master weights, emulated slowdown.

Precision ``auto`` picks fp16 autocast (with loss scaling) on CUDA and bf16
autocast on CPU: measured on our CPUs, fp16 autocast falls back to slow
reference convolutions (5-36x slower than fp32) while bf16 ran 1.0-1.7x
faster than fp32 on the larger models. For the tiny digits CNN at MBS 32,
bf16 measured 11-19% slower than fp32 on a 2-core EPYC
(benchmarks/bench_cost_model.py); ``precision = "fp32"`` is the switch.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hermes.common.tensors import flatten, load_flat

log = logging.getLogger(__name__)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available")
    return dev


def resolve_precision(requested: str, device: torch.device) -> str:
    if requested == "auto":
        return "fp16" if device.type == "cuda" else "bf16"
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


class LocalTrainer:
    def __init__(
        self,
        model: nn.Module,
        *,
        lr: float,
        momentum: float,
        weight_decay: float,
        device: torch.device,
        precision: str,
        slowdown: float = 1.0,
        seed: int = 0,
    ) -> None:
        self.device = device
        self.model = model.to(device)
        self.precision = precision
        self.slowdown = slowdown
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
        # Loss scaling only matters for fp16 gradients on CUDA.
        self.scaler = torch.amp.GradScaler("cuda", enabled=(precision == "fp16" and device.type == "cuda"))
        self.rng = np.random.default_rng(seed)
        # Collective mode: this rank wants to stop; said in its next all-reduce.
        self.stop_requested = False

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def _autocast(self):
        dtype = _AUTOCAST_DTYPES.get(self.precision)
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=dtype)

    def train_cycle(self, x: np.ndarray, y: np.ndarray, batch_size: int, accumulation: int = 1) -> CycleResult:
        """One pass over the assignment in shuffled micro-batches of ``batch_size``.

        With ``accumulation`` > 1 the gradients of that many micro-batches add
        up into one optimizer step (Chao et al.: w_i micro-batches per
        aggregation), each weighted by its share of the step's samples so the
        step follows the mean gradient over all of them whatever the sizes.

        compute_seconds includes the emulated slowdown: the sleep stands for
        the work a slower device would be doing.
        """
        if accumulation < 1:
            raise ValueError(f"accumulation must be >= 1, got {accumulation}")
        self.model.train()
        order = self.rng.permutation(len(y))
        xt = torch.from_numpy(x)
        yt = torch.from_numpy(y)
        step_samples = batch_size * accumulation
        total_loss, steps, micro, compute = 0.0, 0, 0, 0.0
        for step_start in range(0, len(order), step_samples):
            step_order = order[step_start : step_start + step_samples]
            t0, cpu0 = time.perf_counter(), time.thread_time()
            self.optimizer.zero_grad(set_to_none=True)
            for start in range(0, len(step_order), batch_size):
                idx = torch.from_numpy(step_order[start : start + batch_size])
                xb = xt[idx].to(self.device, non_blocking=True)
                yb = yt[idx].to(self.device, non_blocking=True)
                with self._autocast():
                    loss = F.cross_entropy(self.model(xb), yb)
                self.scaler.scale(loss * (len(idx) / len(step_order))).backward()
                total_loss += float(loss.detach())
                micro += 1
            self.scaler.step(self.optimizer)
            self.scaler.update()
            if self.slowdown > 1.0:
                time.sleep(self._work_seconds(t0, cpu0) * (self.slowdown - 1.0))
            compute += time.perf_counter() - t0
            steps += 1
        return CycleResult(samples=len(y), steps=steps, loss=total_loss / max(1, micro), compute_seconds=compute)

    def train_cycle_collective(self, x: np.ndarray, y: np.ndarray, batch_size: int, accumulation: int, steps: int,
                               reduce, weight: str = "samples", power: float = 1.0) -> tuple[CycleResult, float, bool]:
        """Exactly ``steps`` optimizer steps, each on the all-reduced gradient of every rank's step.

        Every rank must take part in the same number of all-reduces, so the
        step count is fixed by the run, not by how many samples arrived: the
        assignment is cut into ``steps`` chunks of ``batch_size * accumulation``
        and a short (or empty) chunk contributes with its real sample count.
        ``reduce(params, weight, stop)`` is ``CollectiveGroup.reduce_gradients``;
        ``weight``: "samples" (union-of-batches gradient), "mean" (1 per rank
        with samples) or "power" (``power``, the rank's compute power).
        Returns (result, seconds waiting in the all-reduce, whether any rank asked to stop).
        The fp16 loss scaler is not used here: a rank-local skip decision would
        split the replicas; non-finite reduced gradients skip the step on every rank alike.
        """
        self.model.train()
        order = self.rng.permutation(len(y))
        xt, yt = torch.from_numpy(x), torch.from_numpy(y)
        params = [p for p in self.model.parameters() if p.requires_grad]
        step_samples = batch_size * accumulation
        total_loss, micro, compute, waited, stop = 0.0, 0, 0.0, 0.0, False
        for step in range(steps):
            chunk = order[step * step_samples:(step + 1) * step_samples]
            t0, cpu0 = time.perf_counter(), time.thread_time()
            self.optimizer.zero_grad(set_to_none=False)
            for start in range(0, len(chunk), batch_size):
                idx = torch.from_numpy(chunk[start:start + batch_size])
                with self._autocast():
                    loss = F.cross_entropy(self.model(xt[idx].to(self.device)), yt[idx].to(self.device))
                (loss * (len(idx) / len(chunk))).backward()
                total_loss += float(loss.detach())
                micro += 1
            if self.slowdown > 1.0:
                time.sleep(self._work_seconds(t0, cpu0) * (self.slowdown - 1.0))
            compute += time.perf_counter() - t0
            t1 = time.perf_counter()
            w = 0.0 if len(chunk) == 0 else {"samples": float(len(chunk)), "mean": 1.0, "power": power}[weight]
            _, stop = reduce(params, w, self.stop_requested)
            waited += time.perf_counter() - t1
            if all(bool(torch.isfinite(p.grad).all()) for p in params):
                self.optimizer.step()
            if stop:
                break
        result = CycleResult(samples=len(y), steps=steps, loss=total_loss / max(1, micro), compute_seconds=compute)
        return result, waited, stop

    @torch.inference_mode()
    def evaluate(self, x: np.ndarray, y: np.ndarray, batch_size: int = 512) -> float:
        """Mean cross-entropy of the local model on a held-out split (the gate's input)."""
        self.model.eval()
        xt, yt = torch.from_numpy(x), torch.from_numpy(y)
        total = 0.0
        for i in range(0, len(yt), batch_size):
            logits = self.model(xt[i : i + batch_size].to(self.device)).float()
            total += float(F.cross_entropy(logits, yt[i : i + batch_size].to(self.device), reduction="sum"))
        return total / max(1, len(yt))

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

    def load(self, flat: torch.Tensor) -> None:
        load_flat(self.model, flat.to(self.device))
