"""What the testbed prints for a --task run: the task's name and its own metric, not the built-in defaults (issue 30)."""

from __future__ import annotations

from pathlib import Path

from hermes.deploy.testbed_summary import format_summary, progress_line

BASE = {
    "preset": "hermes", "profile": "hl1", "clients": 1, "outcome": "server stopped: max_updates=40 reached",
    "wall_seconds": 3.0, "model_updates": 40, "final_loss": 0.5, "best_version": 8, "best_model_file": None,
    "target_accuracy": None, "reached_target": False, "seconds_to_target": None, "messages_total": 9,
    "bytes_sent_total": 0, "bytes_received_total": 0, "workers": [], "links": {},
}


def test_a_task_run_names_its_task_and_its_metric() -> None:
    s = {**BASE, "task": "diabetes-mlp", "dataset": None, "model": None, "target": "r2=0.9",
         "best_metric": "r2", "final_accuracy": None, "final_metrics": {"r2": 0.3276}, "best_accuracy": None,
         "best_metrics": {"r2": 0.5363}}
    text = format_summary(s, Path("/out"))
    assert "task=diabetes-mlp" in text and "dataset=" not in text and "model=cnn" not in text
    assert "final r2 0.3276" in text and "best 0.5363 at version 8" in text
    assert "outcome: server stopped: max_updates=40 reached" in text


def test_a_built_in_run_keeps_dataset_model_and_accuracy() -> None:
    s = {**BASE, "task": "digits-cnn", "dataset": "digits", "model": "cnn", "target": None,
         "best_metric": "accuracy", "final_accuracy": 0.91, "final_metrics": {"accuracy": 0.91},
         "best_accuracy": 0.93, "best_metrics": {"accuracy": 0.93}}
    text = format_summary(s, Path("/out"))
    assert "dataset=digits model=cnn" in text and "final accuracy 0.9100" in text and "best 0.9300" in text


def test_the_progress_line_shows_the_primary_metric() -> None:
    status = {"model_version": 3, "best_metric": "r2", "epoch_progress": 0.5,
              "evaluation": {"accuracy": None, "loss": 0.25, "metrics": {"r2": 0.75}}}
    assert "r2=0.7500 loss=0.2500" in progress_line(1.0, status, [])
    status = {"model_version": 3, "epoch_progress": 0.5, "evaluation": {"accuracy": 0.5, "loss": 1.0}}
    assert "acc=0.5000 loss=1.0000" in progress_line(1.0, status, [])
