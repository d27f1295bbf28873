"""A third-party policy, installed as a package with a ``hermes.policies`` entry point, used by a live run.

The package is built in tmp_path (a module and its ``.dist-info`` with
``entry_points.txt``) and put on the path of a subprocess only: no import
in the run's script names it, the registry finds it by its entry point.
The run is ``hermes.train``: a real uvicorn server and ZeroMQ agents.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
HANG_S = 240  # only catches a hang: the run itself stops after max_updates

SCRIPT = """
import json, sys
import numpy as np
from sklearn.datasets import load_digits
from torch import nn
import hermes
from hermes.common.policies import base

x, y = load_digits(return_X_y=True)
x = (x / 16.0).astype(np.float32); y = y.astype(np.int64)
task = hermes.Task(model=lambda: nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10)),
                   train_data=(x[:1400], y[:1400]), test_data=(x[1400:], y[1400:]), name="plugin-digits")
result = hermes.train(task, agents=2, preset="bsp", max_updates=12, out_dir=sys.argv[1],
                      config={"aggregation": "fedadam", "eval_interval_seconds": 0.5, "cycle_samples": 128})
cls = base.get("aggregation", "fedadam")
print(json.dumps({"module": cls.__module__, "steps": cls.steps, "outcome": result.outcome,
                  "aggregation": result.summary["config"]["aggregation"], "updates": result.updates,
                  "errors": result.agent_errors, "accuracy": result.metrics.get("accuracy")}))
"""


def make_plugin(root: Path, *, value: str = "hermes_fedadam_plugin:FedAdam") -> Path:
    """A package ``hermes_fedadam_plugin`` (examples/fedadam.py) with its entry point, importable from ``root``."""
    pkg = root / "hermes_fedadam_plugin"
    pkg.mkdir(parents=True)
    shutil.copy(ROOT / "examples" / "fedadam.py", pkg / "__init__.py")
    info = root / "hermes_fedadam_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hermes-fedadam-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[hermes.policies]\naggregation.fedadam = {value}\n")
    return root


def test_an_installed_plugin_aggregation_trains_a_live_run(tmp_path: Path) -> None:
    site = make_plugin(tmp_path / "site")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "run")], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # Found by its entry point (the script never imports the package) and folded every step.
    assert out["module"] == "hermes_fedadam_plugin" and out["aggregation"] == "fedadam"
    assert out["errors"] == {} and out["outcome"] == "budget_reached"
    assert out["steps"] == out["updates"] >= 12
    assert out["accuracy"] is not None and out["accuracy"] > 0.3  # chance is 0.1: Adam's steps moved the model


def test_a_broken_plugin_is_one_warning_and_the_built_ins_still_run(tmp_path: Path) -> None:
    site = make_plugin(tmp_path / "site", value="hermes_broken_plugin:FedAdam")
    (site / "hermes_broken_plugin.py").write_text("raise ImportError('needs torch 9')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    code = ("import logging; logging.basicConfig(level=logging.WARNING)\n"
            "from hermes.common.policies import base\n"
            "print(sorted(base.names('aggregation')))")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == 0, proc.stderr
    assert "'mean'" in proc.stdout and "fedadam" not in proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "policy plug-in aggregation.fedadam" in lines[0] and "needs torch 9" in lines[0], lines
