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


def _digits_task(name: str = "ext-digits") -> hermes.Task:
    from examples.custom_loop import TEST, TRAIN

    return hermes.Task(model=lambda: nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10)),
                       train_data=TRAIN, test_data=TEST, name=name)


def test_early_stop_ends_a_run_that_stopped_improving_with_its_best_model(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    # A rate so small that accuracy cannot move: every evaluation after the first is "no better".
    result = hermes.train(_digits_task(), agents=1, preset="asp", max_seconds=120, out_dir=tmp_path / "run",
                          config={"lr": 1e-9, "eval_interval_seconds": 0.2, "early_stop": {"patience": 3}})
    summary = result.summary
    assert result.outcome == "early_stopped", (result.outcome, result.stop_reason)
    assert result.stop_reason.startswith("early stop: accuracy did not improve on")
    stopped = summary["early_stopped"]
    assert stopped["patience"] == 3 and stopped["version"] > stopped["best_version"] == summary["best_version"]
    # The final model is the best one, and the summary's final metrics are its.
    final = load_file(tmp_path / "run" / "model-final.safetensors")
    best = load_file(tmp_path / "run" / "model-best.safetensors")
    assert final.keys() == best.keys() and all(torch.equal(final[k], best[k]) for k in final)
    assert result.metrics["accuracy"] == summary["best_metrics"]["accuracy"]
    events = [line for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines() if "early_stopped" in line]
    assert len(events) == 1
