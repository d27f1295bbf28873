"""hermes.train's callbacks, quiet default, resume and one-line errors, on live runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import hermes
from hermes.callbacks import Callback

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
HANG_S = 240  # only catches a hang

NOTEBOOK = """
import hermes
from examples.custom_loop import TEST, TRAIN
from torch import nn

class Count(hermes.Callback):
    evaluations = 0
    def on_evaluation(self, server, evaluation):
        Count.evaluations += 1

task = hermes.Task(model=lambda: nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10)),
                   train_data=TRAIN, test_data=TEST, name="notebook-digits")
result = hermes.train(task, agents=2, preset="asp", max_updates=40, out_dir=OUT, callbacks=[Count()],
                      config={"eval_interval_seconds": 0.3})
assert Count.evaluations > 0, "the callback heard no evaluation"
"""


def _digits() -> hermes.Task:
    from torch import nn

    from examples.custom_loop import TEST, TRAIN

    return hermes.Task(model=lambda: nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10)),
                       train_data=TRAIN, test_data=TEST, name="cb-digits")


def test_a_notebook_run_prints_at_most_a_progress_line_per_evaluation(tmp_path: Path) -> None:
    out = tmp_path / "run"
    code = f"OUT = {str(out)!r}\n" + NOTEBOOK
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=HANG_S,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    evaluations = sum(1 for line in (out / "events.jsonl").read_text().splitlines()
                      if json.loads(line)["event"] == "evaluation")
    lines = (proc.stdout + proc.stderr).splitlines()
    assert evaluations > 0
    # One progress line per evaluation and the outcome's line; nothing else (no INFO log).
    assert len(lines) <= evaluations + 1, lines
    assert all(line.startswith("hermes: ") for line in lines), lines
    assert lines[-1].startswith("hermes: budget_reached: max_updates=40")


class Recorder(Callback):
    model_version_interval_s = 0.0

    def __init__(self, stop_after: int) -> None:
        self.stop_after = stop_after
        self.evaluations: list[dict[str, Any]] = []
        self.versions: list[int] = []
        self.stops: list[tuple[str, dict[str, Any]]] = []
        self.ended: hermes.Result | None = None

    def on_evaluation(self, server: hermes.Server, evaluation: Any) -> None:
        self.evaluations.append(dict(evaluation))
        if len(self.evaluations) == self.stop_after:
            server.stop("the callback had seen enough")

    def on_model_version(self, server: hermes.Server, version: int) -> None:
        self.versions.append(version)

    def on_stop(self, server: hermes.Server, fact: str, fields: Any) -> None:
        self.stops.append((fact, dict(fields)))

    def on_end(self, server: hermes.Server, result: hermes.Result) -> None:
        self.ended = result


class Broken(Callback):
    def on_evaluation(self, server: hermes.Server, evaluation: Any) -> None:
        raise RuntimeError("my bug")


def test_callbacks_hear_the_run_and_one_may_stop_it(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    rec = Recorder(stop_after=3)
    result = hermes.train(_digits(), agents=2, preset="asp", max_seconds=120, out_dir=tmp_path / "run",
                          callbacks=[Broken(), rec], verbose=0, config={"eval_interval_seconds": 0.3})
    assert result.outcome == "stopped" and result.stop_reason == "the callback had seen enough"
    assert len(rec.evaluations) >= 3 and {"version", "loss", "metrics"} <= set(rec.evaluations[0])
    assert rec.versions == sorted(rec.versions) and rec.versions[0] >= 1
    assert ("stop_requested", {"reason": "the callback had seen enough"}) in rec.stops
    assert rec.ended is result
    # A failing callback is one warning and does not keep the others from hearing the run.
    broken = [r for r in caplog.records if "callback Broken failed on evaluation" in r.getMessage()]
    assert len(broken) == 1 and "my bug" in broken[0].getMessage()


def test_resume_from_python_and_the_out_dir_error_names_trains_arguments(tmp_path: Path) -> None:
    out = tmp_path / "run"
    first = hermes.train(_digits(), agents=1, preset="asp", max_updates=10, out_dir=out, verbose=0)
    assert first.outcome == "budget_reached"
    with pytest.raises(hermes.RunError) as refused:
        hermes.train(_digits(), agents=1, preset="asp", max_updates=20, out_dir=out, verbose=0)
    text = str(refused.value)
    assert "resume=True" in text and "overwrite=True" in text and "out_dir" in text and "--" not in text
    again = hermes.train(_digits(), agents=1, preset="asp", max_updates=20, out_dir=out, verbose=0, resume=True)
    assert again.outcome == "budget_reached" and again.updates >= 20
    assert again.summary["resumed_from"] is not None


def test_a_bad_preset_is_one_line_naming_the_presets() -> None:
    with pytest.raises(ValueError) as bad:
        hermes.train(_digits(), agents=1, preset="fastest", max_seconds=5)
    text = str(bad.value)
    assert "\n" not in text and text.startswith("preset: unknown preset 'fastest'; known: ") and "bsp" in text
    with pytest.raises(ValueError, match="^preset: unknown preset 'hermes-fast'; it is now 'hermes'"):
        hermes.train(_digits(), agents=1, preset="hermes-fast", max_seconds=5)
    with pytest.raises(ValueError, match="resume=True needs out_dir="):
        hermes.train(_digits(), agents=1, max_seconds=5, resume=True)
