"""The simulator's calibration: the real engine's CPU cost per operation, and the testbed agent's FLOP/s.

    python benchmarks/sim_calibrate_cost.py engine [--out FILE] [--repeats N] [--quick]
    python benchmarks/sim_calibrate_cost.py device-flops BENCH_DIR [--out FILE]
    python benchmarks/sim_calibrate_cost.py testbed-table BENCH_DIR

``engine`` drives the production ``Engine`` in-process (as tests/unit/test_engine_inprocess.py
does: signed frames into ``Engine.handle``, no sockets) with MLP models of 10K to 4M parameters and
4 to 1,024 registered workers, and measures the CPU seconds (``time.process_time``: every thread of
this process, not the wall clock, so other processes' load counts less) of each operation the
simulator charges: register, pull, push (decode, checks, screening: the push handled under asp
minus the fold), fold
(``ModelState.apply`` alone), assign (a request for work), heartbeat (the HTTP route's function)
and evaluate (``Evaluator.evaluate_now`` on 2,000 test samples). It fits each operation to
``a + b * params + c * workers`` (least squares, coefficients clipped at 0) and writes the medians and
the fit as JSON: the constants in ``sim/server_cost.py`` come from that file.

``device-flops`` reads a ``hermes-bench`` output folder of testbed runs and prints the unslowed
agent's effective training FLOP/s per run (samples / compute_seconds, times the task's training
FLOPs per sample from ``torch.utils.flop_counter``) and their median: ``TESTBED_FAST_FLOPS`` in
``sim/populations.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hermes.common.clock import ManualClock
from hermes.common.config import build_config
from hermes.common.datasets import ArrayDataset
from hermes.common.task import Task
from hermes.common.wire import Header, MsgType, Payload, encode
from hermes.deploy.bench.machine import loadavg
from hermes.server.engine import Engine
from hermes.server.engine.screening import ScreeningSettings
from hermes.server.events import EventLog
from hermes.server.metrics import ServerMetrics

log = logging.getLogger(__name__)

INPUT = 40  # mnist1d's signal length
CLASSES = 10
EVAL_SAMPLES = 2000  # RunConfig.eval_max_samples' default
OPS = ("register", "pull", "push", "fold", "assign", "evaluate", "heartbeat")


def _mlp(hidden: int) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(INPUT, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
                               torch.nn.ReLU(), torch.nn.Linear(hidden, CLASSES))


def _params(hidden: int) -> int:
    return sum(p.numel() for p in _mlp(hidden).parameters())


def _hidden_for(params: int) -> int:
    # params = h^2 + (INPUT + CLASSES + 2) h + CLASSES
    b = INPUT + CLASSES + 2
    return max(4, round((-b + math.sqrt(b * b + 4 * (params - CLASSES))) / 2))


def _split(name: str, n: int, seed: int) -> ArrayDataset:
    rng = np.random.default_rng(seed)
    x = np.ascontiguousarray(rng.standard_normal((n, INPUT)).astype(np.float32))
    return ArrayDataset(name, x, rng.integers(0, CLASSES, n).astype(np.int64), num_classes=CLASSES)


def _engine(hidden: int, clock: ManualClock, max_workers: int) -> Engine:
    config = build_config("asp", model="mlp", shard_size=64, eval_max_samples=EVAL_SAMPLES)
    splits = (_split("cal", 4096, 0), _split("cal-validation", 256, 1), _split("cal-test", EVAL_SAMPLES, 2))
    # Screening on, as in a run (the preset's default settings).
    return Engine(config, metrics=ServerMetrics(), events=EventLog(None, clock=clock), max_workers=max_workers,
                  max_message_bytes=1 << 28, splits=splits, clock=clock, screening=ScreeningSettings(),
                  task=Task(model=lambda: _mlp(hidden), name="cal"))


class _Agent:
    _sessions = itertools.count()

    def __init__(self, engine: Engine, clock: ManualClock, name: str) -> None:
        self.engine, self.clock = engine, clock
        self.rec, _ = engine.register(name)
        self.session = f"s{next(self._sessions)}"
        self.seq = 0

    def frames(self, type_: MsgType, body: dict[str, Any], payload: torch.Tensor | None = None) -> list[Any]:
        self.seq += 1
        header = Header(type=type_, worker=self.rec.id, session=self.session, seq=self.seq,
                        ts=int(self.clock.time() * 1000), model_version=self.engine.state.version, body=body,
                        shapes=self.engine.spec.shapes if payload is not None else ())
        return encode(header, payload, key=self.rec.key)


def _cpu(fn: Callable[[], object]) -> float:
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def measure(params: int, workers: int, repeats: int) -> dict[str, float]:
    """Median CPU seconds of each operation with a model of ``params`` and ``workers`` registered."""
    from hermes.server.routes.workers import heartbeat

    torch.manual_seed(0)
    hidden = _hidden_for(params)
    clock = ManualClock()
    engine = _engine(hidden, clock, max_workers=workers + repeats + 8)
    agents = [_Agent(engine, clock, f"w{i}") for i in range(workers)]
    loop = asyncio.new_event_loop()
    numel = engine.spec.numel
    gen = torch.Generator().manual_seed(1)
    samples: dict[str, list[float]] = {op: [] for op in OPS}
    try:
        for r in range(repeats):
            a = agents[r % workers]
            clock.advance(0.05)
            samples["register"].append(_cpu(lambda r=r: engine.register(f"new{r}")))
            frames = a.frames(MsgType.REQUEST_WORK, {})
            samples["assign"].append(_cpu(lambda f=frames: loop.run_until_complete(engine.handle(f))))
            frames = a.frames(MsgType.PULL_MODEL, {"dtype": "float32"})
            samples["pull"].append(_cpu(lambda f=frames: loop.run_until_complete(engine.handle(f))))
            delta = torch.randn(numel, generator=gen) * 1e-4
            frames = a.frames(MsgType.PUSH_UPDATE, {"samples": 32, "loss": 1.0}, payload=delta)
            samples["push"].append(_cpu(lambda f=frames: loop.run_until_complete(engine.handle(f))))
            # A zero step through ModelState.apply: the fold's arithmetic; the model does not change.
            zero = Payload(torch.float32, (torch.zeros(numel),), ((numel,),))
            samples["fold"].append(_cpu(lambda p=zero: engine.state.apply([(p, 1.0)])))
            samples["evaluate"].append(_cpu(engine.evaluator.evaluate_now))
            samples["heartbeat"].append(_cpu(lambda a=a: heartbeat(a.rec.id, a.rec.token, engine)))
    finally:
        loop.close()
    medians = {op: statistics.median(v) for op, v in samples.items() if v}
    # The push handled under asp includes its fold; the cost model charges them apart.
    medians["push_total"] = medians["push"]
    medians["push"] = max(0.0, medians["push"] - medians["fold"])
    return medians


# Which terms each operation may have: the worker count only where the engine's code walks the workers
# (registry, allocator, membership); elsewhere a worker term would fit noise and extrapolate it to 10^5
# devices.
TERMS: dict[str, tuple[str, ...]] = {"register": ("a", "c"), "assign": ("a", "c"), "heartbeat": ("a", "c"),
                                     "pull": ("a", "b"), "push": ("a", "b"), "fold": ("a", "b"),
                                     "evaluate": ("a", "b")}


def fit(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per op: seconds = a + b * params + c * workers (the terms of TERMS), least squares on the medians
    weighted by 1/seconds (relative error: 10K and 4M parameters in one fit), coefficients clipped at 0."""
    out: dict[str, dict[str, float]] = {}
    for op in OPS:
        pts = [(r["params"], r["workers"], r["seconds"][op]) for r in rows if op in r["seconds"]]
        if not pts:
            continue
        cols = {"a": lambda p, w: 1.0, "b": lambda p, w: float(p), "c": lambda p, w: float(w)}
        terms = TERMS[op]
        x = np.array([[cols[t](p, w) for t in terms] for p, w, _ in pts])
        y = np.array([s for _, _, s in pts])
        wts = 1.0 / np.maximum(y, 1e-6)
        coef, *_ = np.linalg.lstsq(x * wts[:, None], y * wts, rcond=None)
        got = dict(zip(terms, np.maximum(coef, 0.0), strict=True))
        out[op] = {"a": float(got.get("a", 0.0)), "b_per_param": float(got.get("b", 0.0)),
                   "c_per_worker": float(got.get("c", 0.0))}
    return out


def engine_main(args: argparse.Namespace) -> int:
    torch.set_num_threads(1)
    param_grid = (10_000, 100_000, 1_000_000) if args.quick else (10_000, 100_000, 1_000_000, 4_000_000)
    worker_grid = (4, 64) if args.quick else (4, 64, 1024)
    rows = []
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    load_before = loadavg()
    for params in param_grid:
        for workers in worker_grid:
            secs = measure(params, workers, args.repeats)
            rows.append({"params": _params(_hidden_for(params)), "workers": workers, "seconds": secs})
            print(f"params {rows[-1]['params']:>9,} workers {workers:>5}: "
                  + "  ".join(f"{k} {v * 1e3:.3f} ms" for k, v in secs.items() if k in OPS), flush=True)
    result = {"date": started, "machine": {"platform": platform.platform(), "processor": platform.processor(),
                                           "python": sys.version.split()[0], "torch": torch.__version__,
                                           "threads": torch.get_num_threads()},
              "load_before": load_before, "load_after": loadavg(), "repeats": args.repeats,
              "eval_samples": EVAL_SAMPLES, "rows": rows, "fit": fit(rows)}
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    print(json.dumps(result["fit"], indent=1))
    return 0


def train_flops_per_sample(config: dict[str, Any]) -> float:
    """Forward + backward FLOPs of one training sample of the run's model (torch.utils.flop_counter)."""
    from torch.utils.flop_counter import FlopCounterMode

    from hermes.common.datasets import load_dataset
    from hermes.common.models import build_model

    train, _ = load_dataset(config["dataset"], num_samples=256, seed=0)
    x = torch.as_tensor(np.asarray(train.x[:8]))
    model = build_model(config["model"], input_shape=tuple(x.shape[1:]), num_classes=train.num_classes,
                        **(config.get("model_kwargs") or {}))
    y = torch.zeros(len(x), dtype=torch.long)
    with FlopCounterMode(display=False) as counter:
        torch.nn.functional.cross_entropy(model(x), y).backward()
    return counter.get_total_flops() / len(x)


def device_flops_main(args: argparse.Namespace) -> int:
    rows = []
    thread_rates: list[float] = []
    per_sample: float | None = None
    for path in sorted(Path(args.bench_dir).glob("runs/*/*/r*/summary.json")):
        summary = json.loads(path.read_text())
        link = (summary.get("links") or {}).get("link") if isinstance(summary.get("links"), dict) else None
        if per_sample is None:
            cfg = summary["config"]
            per_sample = train_flops_per_sample({"dataset": summary.get("dataset"), "model": summary.get("model"),
                                                 "model_kwargs": cfg.get("model_kwargs")})
        run = str(path.parent.relative_to(args.bench_dir))
        for w in summary["workers"]:
            if not w.get("compute_seconds"):
                continue
            if w.get("slowdown") == 1.0:
                rows.append({"run": run, "link": link, "samples_per_s": w["samples"] / w["compute_seconds"]})
            else:
                # The testbed sleeps (slowdown - 1) x the step's CPU time (client/trainer.py): samples *
                # slowdown / compute_seconds is the thread's CPU-time rate, which contention does not slow.
                thread_rates.append(w["samples"] * w["slowdown"] / w["compute_seconds"])
    if not rows or per_sample is None:
        print(f"device-flops: no testbed summaries with an unslowed worker under {args.bench_dir}", file=sys.stderr)
        return 2
    for r in rows:
        r["flops"] = r["samples_per_s"] * per_sample
        print(f"{r['run']:<40} {r['samples_per_s']:8.0f} samples/s  {r['flops'] / 1e9:6.2f} GFLOP/s")
    median = statistics.median(r["flops"] for r in rows)
    thread = statistics.median(thread_rates) * per_sample if thread_rates else None
    print(f"train FLOPs per sample {per_sample:,.0f}; unslowed agent (wall, contended): median "
          f"{median / 1e9:.3f} GFLOP/s over {len(rows)} runs; slowed agents' thread CPU rate: median "
          + (f"{thread / 1e9:.3f} GFLOP/s over {len(thread_rates)} agents" if thread else "-"))
    if args.out:
        Path(args.out).write_text(json.dumps({"train_flops_per_sample": per_sample, "median_flops": median,
                                              "thread_cpu_flops": thread, "runs": rows}, indent=1) + "\n")
    return 0


def _median_range(values: list[float], fmt: str) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):{fmt}} [{min(values):{fmt}}-{max(values):{fmt}}]"


def testbed_table_main(args: argparse.Namespace) -> int:
    """Issue 27's calibration table, testbed side: per link and preset, medians [min-max] over the repeats."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for path in sorted(Path(args.bench_dir).glob("runs/*/*/r*/summary.json")):
        profile_link, preset = path.parts[-4], path.parts[-3]
        link = profile_link.partition("@")[2] or "lan"
        groups.setdefault((link, preset), []).append(json.loads(path.read_text()))
    if not groups:
        print(f"testbed-table: no summaries under {args.bench_dir}", file=sys.stderr)
        return 2
    print("| link | preset | reached | seconds to target | messages_total | final accuracy |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for (link, preset), runs in sorted(groups.items()):
        reached = [r["seconds_to_target"] for r in runs if r.get("reached_target")]
        print(f"| {link} | {preset} | {len(reached)}/{len(runs)} | {_median_range(reached, '.1f')} | "
              f"{_median_range([float(r['messages_total']) for r in runs], '.0f')} | "
              f"{_median_range([float(r['final_accuracy']) for r in runs], '.3f')} |")
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("engine", help="the engine's CPU cost per operation vs parameters and workers")
    e.add_argument("--out", default="")
    e.add_argument("--repeats", type=int, default=9)
    e.add_argument("--quick", action="store_true")
    d = sub.add_parser("device-flops", help="the unslowed testbed agent's effective FLOP/s from bench runs")
    d.add_argument("bench_dir")
    d.add_argument("--out", default="")
    t = sub.add_parser("testbed-table", help="the calibration table's testbed side from bench runs")
    t.add_argument("bench_dir")
    args = p.parse_args(argv)
    mains = {"engine": engine_main, "device-flops": device_flops_main, "testbed-table": testbed_table_main}
    return mains[args.cmd](args)


if __name__ == "__main__":
    raise SystemExit(main())
