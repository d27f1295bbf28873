"""Issue 31's accuracy at a fixed training budget: which evaluations count, from which clock."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def _write_run(root: Path, label: str, repeat: str, join_elapsed: float, evals: list[tuple[float, float]]) -> None:
    d = root / "runs" / "hl8@lte" / label / repeat
    d.mkdir(parents=True)
    origin_ts = 1000.0  # the server's clock starts at ts 1000
    timeline = [{"version": i, "accuracy": acc, "elapsed": t} for i, (t, acc) in enumerate(evals)]
    (d / "summary.json").write_text(json.dumps({"accuracy_timeline": timeline}))
    (d / "run.json").write_text(json.dumps({"loadavg_before": [2.0], "loadavg_after": [3.0]}))
    events = [{"ts": origin_ts - 1.0, "event": "testbed_start"}]
    events += [{"ts": origin_ts + join_elapsed - 0.5 * w, "event": "join", "worker": f"worker-{w}"} for w in range(2)]
    events += [{"ts": origin_ts + t, "event": "evaluation", "elapsed": t, "version": i, "accuracy": acc}
               for i, (t, acc) in enumerate(evals)]
    (d / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))


def test_budget_counts_from_the_last_join_and_leaves_later_evaluations_out(tmp_path: Path) -> None:
    # Training starts at the last join, 10 s on the server's clock: a 20 s budget ends at 30 s.
    evals = [(12.0, 0.5), (24.0, 0.70), (26.0, 0.80), (28.0, 0.78), (30.0, 0.82), (32.0, 0.99)]
    _write_run(tmp_path, "compressed", "r0", 10.0, evals)
    _write_run(tmp_path, "plain", "r0", 10.0, [(t, a - 0.01) for t, a in evals])
    # Evaluated last at 15 s of training: short of the budget, so it must not be compared.
    _write_run(tmp_path, "plain", "r1", 10.0, [(25.0, 0.9)])
    out = subprocess.run([sys.executable, "benchmarks/edge_budget_accuracy.py", str(tmp_path), "--budget", "20",
                          "--pair", "compressed,plain"], capture_output=True, text=True, check=True).stdout
    assert "| `compressed` | r0 | 82.0 (20.0) | 80.0 | 2.0 -> 3.0 |" in out  # (0.80 + 0.78 + 0.82) / 3
    assert "| `plain` | r0 | 81.0 (20.0) | 79.0 |" in out
    assert "| `plain` | r1 | did not train that long | - |" in out
    assert "per repeat: last +1.0 (median +1.0); mean of last +1.0 (median +1.0)" in out
    # Binomial, at the median of the comparable runs' last evaluations (0.815): sqrt(0.815 * 0.185 / 500).
    assert "at accuracy 0.815 on 500 test samples: 1.7 points" in out
