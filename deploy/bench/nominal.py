"""The task's uncontended train-step cost per sample: one nominal for every emulated device and ``alone``.

    python -m hermes.deploy.bench.nominal --dataset mnist1d --model cnn --overrides '{"num_samples": 20000}'

``hermes-bench`` runs this once per invocation of a suite whose ``slowdown_mode`` is ``nominal``, in a fresh
process before any run starts, and hands the figure to every agent and to ``alone`` (``--nominal-sample-ms``,
common/pace.py): a device S times slower then takes S times this per sample on the wall clock, whichever loop
trains it. Before it each side paced from its own loop's least cost, and the two loops differ (``alone``'s
``deploy/ddp_rank.py`` and the agents' ``LocalTrainer``: at pace 6 ``alone`` ran 17.3-18.8 ms a step against the
agents' 14.0-15.9, docs/compression.md, fifth pass).

A step is what both loops time: zero_grad, forward, the task's loss, backward and the optimizer step (the
task's optimizer, else momentum SGD as the run config says), one torch thread, at the run config's batch size,
on the task's own training samples. Its cost is ``min(wall, thread CPU)`` as the loops take it, and the nominal
the least per sample over ``--steps`` steps after ``--warmup`` (contention only ever adds to a step's cost).
Prints one JSON object: ``nominal_sample_ms``, the median per sample, the batch and the step count.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

DEFAULT_STEPS = 300
DEFAULT_WARMUP = 20


def probe(dataset: str, model: str, overrides: dict[str, Any], *, steps: int = DEFAULT_STEPS,
          warmup: int = DEFAULT_WARMUP) -> dict[str, Any]:
    """Train ``warmup + steps`` steps of the task and return the least and median cost per sample (ms)."""
    import numpy as np
    import torch

    from hermes.common.config import build_config
    from hermes.common.task import as_dataset, dataset_len
    from hermes.common.task_registry import batch_of, resolve_task

    torch.set_num_threads(1)
    cfg = build_config("bsp", dataset=dataset, model=model, **overrides)
    torch.manual_seed(cfg.seed)
    task = resolve_task(cfg.task, cfg)
    assert task.train_data is not None, "the probe trains on the task's own data"
    train = as_dataset(task.train_data)
    net = task.model()
    opt = (task.optimizer(net.parameters()) if task.optimizer is not None else
           torch.optim.SGD(net.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay))
    n = dataset_len(train)
    x_all, y_all = batch_of(train, range(n))
    rng = np.random.default_rng(cfg.seed)
    batch = min(cfg.batch_size, n)
    costs: list[float] = []
    for i in range(warmup + steps):
        idx = rng.choice(n, size=batch, replace=False)
        s0, c0 = time.perf_counter(), time.thread_time()
        opt.zero_grad(set_to_none=True)
        task.loss(net(x_all[idx]), y_all[idx]).backward()
        opt.step()
        cost = min(time.perf_counter() - s0, time.thread_time() - c0)
        if i >= warmup:
            costs.append(cost / batch)
    return {"nominal_sample_ms": round(1000.0 * min(costs), 6), "median_sample_ms": round(
        1000.0 * statistics.median(costs), 6), "batch_size": batch, "steps": steps, "warmup": warmup,
        "dataset": dataset, "model": model}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--overrides", default="{}", help="run-config overrides, JSON (the suite's)")
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    p.add_argument("--warmup", type=int, default=DEFAULT_WARMUP)
    a = p.parse_args(argv)
    if a.steps < 1 or a.warmup < 0:
        print("nominal: --steps must be >= 1 and --warmup >= 0", file=sys.stderr)
        return 2
    try:
        overrides = json.loads(a.overrides)
    except ValueError as exc:
        print(f"nominal: --overrides is not JSON: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(probe(a.dataset, a.model, overrides, steps=a.steps, warmup=a.warmup)))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
