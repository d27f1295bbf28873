"""A short run of benchmarks/load_test.py: 64 simulated agents against one real server.

The 5-minute run is the script itself (``python benchmarks/load_test.py``);
this one keeps the default suite honest about many concurrent signed
clients, heartbeats and durable acknowledgements.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.integration


def test_64_simulated_agents_short_run(tmp_path):
    out = tmp_path / "load.json"
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "load_test.py"), "--agents", "64",
                           "--seconds", "10", "--json", str(out)], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["client_errors"] == 0 and res["server_errors"] == {} and res["server_tracebacks"] == 0
    assert res["workers_lost"] == 0 and res["heartbeats"] > 64
    # Every push an agent saw acknowledged was applied by the server, and nothing else was.
    assert res["pushes"] == res["server_applied"] > 64
    assert res["peak_rss_mb"] - res["rss_before_agents_mb"] < 300, res
