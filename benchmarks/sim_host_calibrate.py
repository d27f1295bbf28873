"""The host model's constants (``sim/host.py``): an agent's CPU per training sample and per message, on this machine.

    python benchmarks/sim_host_calibrate.py [--repeats 30] [--hidden 320] [--json FILE]

Measured in one process, one torch thread, ``time.thread_time`` (CPU seconds of this thread: the machine's
other load delays them but does not add to them), on the calibration's task (mnist1d, the paper's CNN at
``--hidden``):

* ``thread_flops``: training FLOP/s of one agent thread, ``LocalTrainer.train_cycle`` on 128 samples in
  batches of 32 (the testbed's cycle), times the FLOPs per sample the simulator counts
  (``sim.run.flops_per_sample``);
* ``push_cpu_s``: what an agent's push costs its own CPU: the update's signed encoding (``common.wire.encode``
  with a key, which MACs the payload);
* ``reply_cpu_s``: what a model reply costs it: decoding and MAC-checking the frames, then loading the
  weights into its model (``load_flat``).

The medians go into ``sim/host.py`` (``THREAD_FLOPS``, ``AGENT_PUSH_CPU_S``, ``AGENT_REPLY_CPU_S``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from hermes.common.config import build_config
from hermes.common.task_registry import batch_of, resolve_task
from hermes.common.tensors import build_checked, flatten, load_flat, spec_of
from hermes.common.wire import Header, MsgType, decode, encode, verify_mac
from hermes.deploy.bench.machine import loadavg
from hermes.server.shardstore import load_splits
from hermes.sim.executor import build_trainer
from hermes.sim.run import flops_per_sample


def _cpu(fn: Callable[[], object], repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.thread_time()
        fn()
        out.append(time.thread_time() - t0)
    return out


def calibration_trainer(hidden: int) -> tuple[Any, Any, Any, Any]:
    """The calibration workload's task, spec, training split and agent trainer (mnist1d 20k, the CNN of
    ``hidden``), the spec as the server builds it (Engine._initial_state)."""
    cfg = build_config("asp", dataset="mnist1d", num_samples=20000, model_kwargs={"hidden": hidden})
    task = resolve_task(cfg.task, cfg)
    train, _validation, _test = load_splits(cfg, task)
    spec = spec_of(task.model(), cfg.model, task=task.name, input_shape=tuple(batch_of(train, [0])[0].shape[1:]))
    return task, spec, train, build_trainer(task, cfg, spec)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--hidden", type=int, default=320)
    p.add_argument("--json", default=None, help="also write the figures here")
    a = p.parse_args()
    torch.set_num_threads(1)
    task, spec, train, trainer = calibration_trainer(a.hidden)
    x, y = batch_of(train, list(range(128)))
    train_flops, _ = flops_per_sample(task, spec, train)
    load_before = loadavg()
    trainer.train_cycle(x, y, 32)  # warm-up
    cycle = _cpu(lambda: trainer.train_cycle(x, y, 32), a.repeats)
    key = b"k" * 32
    flat = flatten(trainer.model).clone()
    header = Header(type=MsgType.PUSH_UPDATE, worker="w", session="s", seq=1, model_version=1,
                    shapes=tuple(tuple(t.shape) for t in trainer.model.parameters()), body={})
    push = _cpu(lambda: encode(header, flat, key=key), a.repeats)
    frames = [bytes(memoryview(f)) if not isinstance(f, bytes) else f for f in encode(header, flat, key=key)]
    model = build_checked(task.model, spec)

    def receive() -> None:
        msg = decode(frames)
        verify_mac(frames[0], msg.header, frames[1:], key)
        load_flat(model, msg.payload.flat() if msg.payload is not None else flat)

    reply = _cpu(receive, a.repeats)
    med = {k: statistics.median(v) for k, v in (("cycle", cycle), ("push", push), ("reply", reply))}
    # A step's cost that does not grow with its batch (optimizer step, zero_grad, the framework's per-call
    # overhead): 256 samples in batches of each size, CPU = steps x step + samples x sample, least squares.
    x256, y256 = batch_of(train, list(range(256)))
    by_batch = {}
    for bs in (16, 32, 64, 128):
        trainer.train_cycle(x256, y256, bs)
        by_batch[bs] = statistics.median(_cpu(lambda bs=bs: trainer.train_cycle(x256, y256, bs), a.repeats))
    pts = [(256 / bs, t) for bs, t in by_batch.items()]
    n = len(pts)
    mx, my = sum(p[0] for p in pts) / n, sum(p[1] for p in pts) / n
    step_s = sum((p[0] - mx) * (p[1] - my) for p in pts) / sum((p[0] - mx) ** 2 for p in pts)
    sample_s = (my - step_s * mx) / 256
    figures = {
        "thread_flops": 128 * train_flops / med["cycle"],
        "cycle_cpu_s": med["cycle"], "train_flops_per_sample": train_flops,
        "push_cpu_s": med["push"], "reply_cpu_s": med["reply"], "params": flat.numel(),
        "cycle256_cpu_s_by_batch": by_batch, "step_cpu_s": step_s, "sample_cpu_s": sample_s,
        "repeats": a.repeats, "load_before": load_before, "load_after": loadavg(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    print(json.dumps(figures, indent=2))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(figures, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
