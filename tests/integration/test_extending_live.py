"""The user's hooks in live runs (real uvicorn server, ZeroMQ agents in this process)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from torch import nn

import hermes
from hermes.client.steps import StepContext

pytestmark = pytest.mark.integration


def test_the_custom_loop_example_trains_with_its_own_step_and_augmentation(tmp_path: Path) -> None:
    from examples import custom_loop

    steps: list[int] = []
    transforms = {True: 0, False: 0}

    def counted_step(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor], opt: torch.optim.Optimizer,
                     ctx: StepContext) -> torch.Tensor:
        steps.append(ctx.samples)
        return custom_loop.train_step(model, batch, opt, ctx)

    def counted_transform(x: torch.Tensor, y: torch.Tensor, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
        transforms[train] += 1
        return custom_loop.augment(x, y, train)

    task = dataclasses.replace(custom_loop.task, train_step=counted_step, transform=counted_transform)
    result = hermes.train(task, agents=2, preset="asp", max_updates=30, out_dir=tmp_path / "run",
                          config={"eval_interval_seconds": 0.5})
    assert result.outcome == "budget_reached" and result.agent_errors == {}, result.stop_reason
    assert result.updates >= 30 and len(steps) > 0
    # Every sample the agents trained went through the hook's steps, and every training batch through the transform.
    trained = sum(w["samples"] for w in result.summary["workers"])
    assert sum(steps) >= trained > 0 and transforms[True] == len(steps)
    assert transforms[False] > 0  # the server's evaluations (train False)
    assert result.metrics["accuracy"] > 0.5, result.metrics  # chance: 0.1
