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


def test_federated_evaluation_on_device_local_data_matches_a_direct_computation(tmp_path: Path) -> None:
    """Two devices with their own training and held-out data of different sizes and class mixes.

    The rate is so small that every version scores as the final model does, so the test can
    compute the samples-weighted metric directly from model-final.safetensors and each device's data.
    """
    import numpy as np
    from safetensors.torch import load_file

    from examples.custom_loop import TEST, TRAIN

    x, y = TRAIN
    held = {"worker-1": (x[:90], y[:90]), "worker-2": (x[y >= 5][:250], y[y >= 5][:250])}

    def local_data(name: str) -> tuple[np.ndarray, np.ndarray]:
        part = slice(400, 900) if name == "worker-1" else slice(900, 1400)
        return x[part], y[part]

    def local_eval_data(name: str) -> tuple[np.ndarray, np.ndarray]:
        return held[name]

    task = hermes.Task(model=lambda: nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10)),
                       test_data=TEST, local_data=local_data, local_eval_data=local_eval_data, name="fed-digits")
    seen: list[dict[str, object]] = []

    class Federated(hermes.Callback):
        def on_evaluation(self, server: hermes.Server, evaluation: object) -> None:
            if isinstance(evaluation, dict) and evaluation.get("federated"):
                seen.append(evaluation)

    # federated_loss <= 100 holds at once: the run stops at its first federated evaluation, by that target.
    result = hermes.train(task, agents=2, preset="asp", target="federated_loss=100", max_seconds=120,
                          out_dir=tmp_path / "run", callbacks=[Federated()], verbose=0,
                          # Both registered before any work: the first round is both devices'.
                          config={"lr": 1e-9, "eval_interval_seconds": 0.3, "federated_eval": {"every": 1},
                                  "min_workers": 2})
    assert result.outcome == "target_reached", (result.outcome, result.stop_reason)
    assert result.stop_reason.startswith("target federated_loss=100 reached")
    fed = result.summary["federated_evaluations"][0]
    assert fed["workers"] == sorted(result.summary["federated_evaluations"][0]["workers"])
    assert len(fed["workers"]) == 2 and fed["samples"] == 90 + 250
    assert result.summary["federated_evaluation"] == result.summary["federated_evaluations"][-1]
    assert seen and seen[0]["metrics"] == fed["metrics"]

    model = task.model()
    model.load_state_dict(load_file(tmp_path / "run" / "model-final.safetensors"))
    losses, correct, n, per_device = 0.0, 0.0, 0, []
    with torch.no_grad():
        for hx, hy in held.values():
            out = model(torch.as_tensor(hx))
            target = torch.as_tensor(hy)
            loss = float(nn.functional.cross_entropy(out, target))
            losses += loss * len(hy)
            correct += float((out.argmax(dim=1) == target).double().sum())
            n += len(hy)
            per_device.append(loss)
    assert fed["metrics"]["federated_accuracy"] == pytest.approx(correct / n, abs=1e-6)
    assert fed["metrics"]["federated_loss"] == pytest.approx(losses / n, abs=1e-5)
    # Weighted by samples, not a mean of the two devices' values (their sizes differ 90 to 250).
    assert abs(sum(per_device) / 2 - losses / n) > 1e-3
    events = [line for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()
              if '"federated_evaluation"' in line]
    assert len(events) >= 1
