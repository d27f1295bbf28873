"""Samples to target of a training scheme, with no clock, processes or links: the ceiling a cluster can reach.

    python benchmarks/hl2_sample_efficiency.py alone --batch 32 --lr 0.025
    python benchmarks/hl2_sample_efficiency.py sync --batches 32,24,24,16 --steps 8 --lr 0.1
    python benchmarks/hl2_sample_efficiency.py async --speeds 1,0.75,0.75,0.5 --steps 8 --lr 0.1 --weight 0.3

A cluster with C times its fastest device's compute, that needs k times that device's samples to the target, can
be at most C/k times faster than it alone, whatever its links and code. This script measures k for a scheme on
the ``hl2-alone`` suite's task (mnist1d 20k, the paper-size CNN, target 0.9 on 2,000 test samples; ``--target``
changes it) in one process, each worker's steps run in turn on one torch thread:

- ``alone``: one model, momentum SGD at ``--batch`` and ``--lr``, tested every 160 samples (the suite's
  ``alone`` tests every 5 steps of 32).
- ``sync``: synchronous local SGD (Stich 2019; OmniLearn's variable batching splits the batches): every worker
  starts the round from the global model, takes ``--steps`` steps at its batch, and the new global model is the
  batch-weighted average of the workers' models (the ``samples`` aggregation). Local momentum carries over
  rounds, as the agents' optimizers do. Tested every 8 steps' worth of rounds.
- ``async``: each worker's cycle of ``--steps`` steps starts from the global model it last pulled; the server
  adds ``--weight`` times its change when it ends, workers finishing in the order their ``--speeds`` give.

Samples are drawn uniformly with replacement from the whole training set (IID), so these are the schemes'
statistical costs alone. Measured 2026-11-28 (docs/compression.md, "ninth pass"): alone 20.0-24.5k samples;
sync at batches 32,24,24,16 and 8 steps lr 0.1 25.3-36.1k; async as above 38.9-45.1k.
"""

from __future__ import annotations

import argparse
import copy
import heapq
import statistics
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch


class Workload:
    """The suite's task: its model, loss and data as tensors."""

    def __init__(self, suite: str, target: float) -> None:
        from hermes.common.config import build_config
        from hermes.common.task import as_dataset, dataset_len
        from hermes.common.task_registry import batch_of, resolve_task
        from hermes.deploy.bench.suites import BUILTIN

        spec = BUILTIN[suite]
        overrides = dict(spec.get("overrides", {}))
        cfg = build_config("bsp", dataset=spec["dataset"], model=spec.get("model", "cnn"), **overrides)
        self.task = resolve_task(cfg.task, cfg)
        assert self.task.train_data is not None and self.task.test_data is not None
        train, test = as_dataset(self.task.train_data), as_dataset(self.task.test_data)
        self.x, self.y = batch_of(train, range(dataset_len(train)))
        self.xt, self.yt = batch_of(test, range(min(dataset_len(test), cfg.eval_max_samples)))
        self.target = target

    def model(self, seed: int) -> torch.nn.Module:
        torch.manual_seed(seed)
        return self.task.model()

    def reached(self, model: torch.nn.Module) -> bool:
        with torch.no_grad():
            return float((model(self.xt).argmax(1) == self.yt).float().mean()) >= self.target

    def step(self, model: torch.nn.Module, opt: torch.optim.Optimizer, rng: np.random.Generator, batch: int) -> None:
        idx = torch.from_numpy(rng.integers(0, len(self.x), batch))
        opt.zero_grad(set_to_none=True)
        self.task.loss(model(self.x[idx]), self.y[idx]).backward()
        opt.step()


def _sgd(model: torch.nn.Module, lr: float, momentum: float) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)


def alone(w: Workload, seed: int, a: argparse.Namespace) -> int | None:
    m = w.model(seed)
    opt, rng = _sgd(m, a.lr, a.momentum), np.random.default_rng(seed)
    samples, every = 0, max(1, 160 // a.batch)
    for step in range(1, a.limit // a.batch + 1):
        w.step(m, opt, rng, a.batch)
        samples += a.batch
        if step % every == 0 and w.reached(m):
            return samples
    return None


def sync(w: Workload, seed: int, a: argparse.Namespace) -> int | None:
    g = w.model(seed)
    rng, total = np.random.default_rng(seed), sum(a.batches)
    workers = [(m, _sgd(m, a.lr, a.momentum), b) for b in a.batches for m in [copy.deepcopy(g)]]
    samples, rounds, every = 0, 0, max(1, 8 // a.steps)
    while samples < a.limit:
        start = [p.detach().clone() for p in g.parameters()]
        new = [torch.zeros_like(p) for p in start]
        for m, opt, b in workers:
            with torch.no_grad():
                for q, p in zip(m.parameters(), start):
                    q.copy_(p)
            for _ in range(a.steps):
                w.step(m, opt, rng, b)
            with torch.no_grad():
                for n, q in zip(new, m.parameters()):
                    n.add_(q, alpha=b / total)  # the samples aggregation: weights b_k / sum(b)
        with torch.no_grad():
            for p, n in zip(g.parameters(), new):
                p.copy_(n)
        samples += a.steps * total
        rounds += 1
        if rounds % every == 0 and w.reached(g):
            return samples
    return None


def async_(w: Workload, seed: int, a: argparse.Namespace) -> int | None:
    g = w.model(seed)
    rng, batch = np.random.default_rng(seed), a.batch
    models = [copy.deepcopy(g) for _ in a.speeds]
    opts = [_sgd(m, a.lr, a.momentum) for m in models]
    bases = [[p.detach().clone() for p in g.parameters()] for _ in a.speeds]
    due = [(a.steps * batch / s, k) for k, s in enumerate(a.speeds)]
    heapq.heapify(due)
    samples = pushes = 0
    while samples < a.limit:
        t, k = heapq.heappop(due)
        for _ in range(a.steps):
            w.step(models[k], opts[k], rng, batch)
        samples += a.steps * batch
        with torch.no_grad():
            for p, q, b in zip(g.parameters(), models[k].parameters(), bases[k]):
                p.add_(q - b, alpha=a.weight)
            for q, p in zip(models[k].parameters(), g.parameters()):
                q.copy_(p)  # the worker pulls the model it pushed into
            bases[k] = [p.detach().clone() for p in g.parameters()]
        pushes += 1
        heapq.heappush(due, (t + a.steps * batch / a.speeds[k], k))
        if pushes % len(a.speeds) == 0 and w.reached(g):
            return samples
    return None


SCHEMES: dict[str, Callable[[Workload, int, argparse.Namespace], int | None]] = {
    "alone": alone, "sync": sync, "async": async_}


def _floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",") if v.strip()]


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("scheme", choices=sorted(SCHEMES))
    p.add_argument("--suite", default="hl2-alone", help="the built-in suite whose task to train (default hl2-alone)")
    p.add_argument("--target", type=float, default=None, help="test accuracy to reach (default: the suite's)")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--lr", type=float, default=0.025)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--batch", type=int, default=32, help="alone's and async's batch")
    p.add_argument("--batches", type=_ints, default=[32, 24, 24, 16], help="sync: each worker's batch")
    p.add_argument("--steps", type=int, default=8, help="sync, async: local steps a round or cycle")
    p.add_argument("--speeds", type=_floats, default=[1.0, 0.75, 0.75, 0.5], help="async: relative speeds")
    p.add_argument("--weight", type=float, default=0.25, help="async: the server's weight on a change")
    p.add_argument("--limit", type=int, default=200_000, help="give up after this many samples")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    from hermes.deploy.bench.suites import BUILTIN

    if a.suite not in BUILTIN:
        p.error(f"unknown suite {a.suite!r}; built-in: {', '.join(sorted(BUILTIN))}")
    w = Workload(a.suite, a.target if a.target is not None else float(BUILTIN[a.suite]["target_accuracy"]))
    results: list[Any] = []
    for seed in _ints(a.seeds):
        results.append(SCHEMES[a.scheme](w, seed, a))
        print(f"seed {seed}: {results[-1] if results[-1] is not None else 'not reached'} samples", flush=True)
    reached = [r for r in results if r is not None]
    if reached:
        print(f"median {statistics.median(reached):,.0f} samples ({len(reached)} of {len(results)} reached)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
