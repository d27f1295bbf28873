"""A synthetic ``results.json`` for the hermes-bench unit tests: known numbers, real shapes.

The shapes follow a real testbed ``summary.json`` (``workers[*].cycle_log``
with ``cycle_log_fields``, ``workload_history``, ``accuracy_timeline``,
``messages_by_type``); the numbers are chosen so that every median,
min-max and speed-up can be worked out by hand.
"""

from __future__ import annotations

import copy
from typing import Any

FIELDS = ["elapsed", "dss", "batch_size", "compute_seconds", "z", "pushed"]

# seconds to target per repeat (None: missed), per variant
TIMES = {
    "bsp": [10.0, 12.0, 14.0],
    "hermes": [4.0, 5.0, 8.0],
    "asp": [None, None, None],
    "ssp": [6.0, None, 9.0],
}


def summary(preset: str, seed: int, seconds: float | None) -> dict[str, Any]:
    reached = seconds is not None
    wall = seconds if reached else 30.0
    workers = []
    for i, speed in enumerate((0.1875, 0.1875, 0.125, 1.0)):
        # A slower worker takes longer per cycle; each cycle's time depends on seed and worker.
        log = [[1.0 + c, 128, 32, round((0.1 + 0.01 * c) / speed * (1 + 0.1 * seed), 6), None, True]
               for c in range(5 + i)]
        workers.append({
            "id": f"w{i + 1:04d}", "name": f"worker-{i + 1}", "speed": speed, "cycles": len(log),
            "wi": 1.0 + 0.5 * i, "dss": 128 + 64 * i, "batch_size": 32, "pushes": 4, "pulls": 4,
            "bytes_sent": 1_000_000, "bytes_received": 2_000_000, "compute_seconds": sum(r[3] for r in log),
            "workload_history": [[0.5, 128, 32], [3.0, 128 + 64 * i, 32]],
            "cycle_log_fields": FIELDS, "cycle_log": log,
        })
    return {
        "preset": preset, "profile": "hl8", "clients": 4, "dataset": "digits", "model": "cnn",
        "outcome": "target reached" if reached else "time limit", "wall_seconds": wall,
        "target_accuracy": 0.85, "final_accuracy": 0.9 if reached else 0.6, "best_accuracy": 0.91 if reached else 0.62,
        "reached_target": reached, "seconds_to_target": seconds,
        "model_updates": 100 + 10 * seed, "messages_total": 1000 + seed,
        "messages_by_type": {"push_update": 40, "pull_model": 44 + seed, "fetch_shard": 500, "request_work": 400},
        "bytes_sent_total": 4_000_000, "bytes_received_total": 8_000_000 + seed * 1_000_000,
        "accuracy_timeline": [{"version": 0, "accuracy": 0.1, "elapsed": 1.0},
                              {"version": 10, "accuracy": 0.9 if reached else 0.6, "elapsed": 2.0 + wall}],
        "workers": workers,
    }


def make_results(times: dict[str, list[float | None]] | None = None, baseline: str = "bsp") -> dict[str, Any]:
    times = copy.deepcopy(times or TIMES)
    variants = [{"label": p, "preset": p, "overrides": {}} for p in times]
    runs = []
    for repeat in range(3):
        for p, ts in times.items():
            s = summary(p, repeat, ts[repeat])
            runs.append({
                "key": f"hl8/{p}/r{repeat}", "variant": p, "preset": p, "overrides": {}, "profile": "hl8",
                "repeat": repeat, "seed": repeat, "run_dir": f"runs/hl8/{p}/r{repeat}", "status": "ok", "error": None,
                "testbed_exit": 0, "elapsed_seconds": 20.0, "loadavg_before": [1.5, 1.0, 0.9],
                "loadavg_after": [1.7, 1.1, 0.9], "summary": s,
                "events": {"first_join_elapsed": 1.0,
                           "train_seconds_to_target": None if ts[repeat] is None else ts[repeat] - 2.0},
            })
    return {
        "format": 1,
        "suite": {"name": "fixture", "description": "synthetic", "variants": variants, "profiles": ["hl8"],
                  "clients": 4, "dataset": "digits", "model": "cnn", "repeats": 3, "seed": 0,
                  "target_accuracy": 0.85, "max_seconds": 30.0, "overrides": {}, "baseline": baseline,
                  "run_timeout_seconds": None},
        "machine": {"cpu_model": "Test CPU", "cpu_count": 2, "cpus_usable": 2, "python": "3.11", "platform": "Linux"},
        "versions": {"hermes-edge": "0.1.0", "torch": "2.13.0"},
        "written_at": 1_700_000_000.0,
        "runs": runs,
    }
