"""Your own local training step: a learning-rate schedule, gradient clipping and augmentation.

    hermes-testbed --task examples.custom_loop:task --clients 2 --preset asp --target accuracy=0.9

or from Python::

    import hermes
    from examples.custom_loop import task
    hermes.train(task, agents=2, preset="asp", target="accuracy=0.9", max_seconds=60)

The task is scikit-learn's digits (8x8 images, flattened) and a small MLP. Two hooks change
how each agent trains (docs/extending.md):

- ``transform(x, y, train)``: on every training batch, Gaussian pixel noise and a random
  brightness scale (augmentation); evaluation batches (``train`` False) pass unchanged.
- ``train_step(model, batch, optimizer, ctx)``: one optimizer step of the agent. The framework
  still picks the samples and the number of steps (the server's cycle budget), the precision
  (``ctx.loss`` runs under the agent's autocast) and the loss scaling (``ctx.backward``), and
  counts the samples; this step adds a linear warm-up then cosine decay of the learning rate
  on top of the server's rate (``ctx.scale_lr``) and clips the gradient norm
  (``ctx.clip_grad_norm``, after the scaler's unscale).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from hermes import Task
from hermes.client.steps import StepContext

WARMUP_STEPS = 20
DECAY_STEPS = 400  # steps of this agent over which the rate decays to FLOOR of the server's
FLOOR = 0.1
MAX_GRAD_NORM = 1.0
NOISE_STD = 0.05


def digits() -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    y = y.astype(np.int64)
    return (x[:1400], y[:1400]), (x[1400:], y[1400:])


TRAIN, TEST = digits()


def lr_factor(step: int) -> float:
    """Linear warm-up over WARMUP_STEPS, then cosine decay to FLOOR over DECAY_STEPS (then FLOOR)."""
    if step < WARMUP_STEPS:
        return (step + 1) / WARMUP_STEPS
    t = min(1.0, (step - WARMUP_STEPS) / DECAY_STEPS)
    return FLOOR + (1.0 - FLOOR) * 0.5 * (1.0 + math.cos(math.pi * t))


def augment(x: torch.Tensor, y: torch.Tensor, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
    if not train:
        return x, y
    brightness = torch.empty(len(x), 1, device=x.device).uniform_(0.8, 1.2)
    return (x * brightness + NOISE_STD * torch.randn_like(x)).clamp_(0.0, 1.5), y


def train_step(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor], optimizer: torch.optim.Optimizer,
               ctx: StepContext) -> torch.Tensor:
    x, y = batch
    ctx.scale_lr(lr_factor(ctx.global_step))
    loss = ctx.loss(model, x, y)
    ctx.backward(loss)
    ctx.clip_grad_norm(optimizer, MAX_GRAD_NORM)
    ctx.step(optimizer)
    return loss


def model() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


task = Task(model=model, train_data=TRAIN, test_data=TEST, name="custom-loop-digits",
            train_step=train_step, transform=augment)
