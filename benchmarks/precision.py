#!/usr/bin/env python
"""What precision ``auto`` picks for each built-in model, and the timings it picks from.

    python benchmarks/precision.py [--threads 1] [--batch 32] [--repeats 3]

For each built-in model on the input shape of the data set it is used with
(cnn on digits 8x8, mnist1d 40 and MNIST 28x28; mlp on mnist1d; alexnet and
resnet18 on CIFAR-10 32x32) this runs the agent's own measurement
(``hermes.client.precision.measure``, the timed steps precision ``auto``
takes at registration) ``--repeats`` times and prints each precision's
median step time, the choice, and how long the measurement took. The first
measurement in a process also pays torch's one-time start-up (seconds, paid
by the agent's first training step anyway); it is run once untimed first.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from hermes.client.precision import candidates, choose, measure
from hermes.common.builtin_task import classification_example
from hermes.common.models import build_model

MODELS = (
    ("cnn", "digits", (1, 8, 8)),
    ("cnn", "mnist1d", (1, 40)),
    ("mlp", "mnist1d", (1, 40)),
    ("cnn", "mnist", (1, 28, 28)),
    ("alexnet", "cifar10", (3, 32, 32)),
    ("resnet18", "cifar10", (3, 32, 32)),
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the testbed's agents run 1)")
    ap.add_argument("--batch", type=int, default=32, help="batch size (the run config's default)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    precisions = candidates(device)
    measure(build_model("mlp", input_shape=(1, 40), num_classes=10), classification_example((1, 40), 10), args.batch,
            device, precisions)
    print(f"device {device}, {args.threads} thread(s), batch {args.batch}, medians of {args.repeats} measurements")
    print(f"{'model':<10} {'data':<8} " + " ".join(f"{p + ' ms':>10}" for p in precisions)
          + f" {'choice':>7} {'measure s':>10}")
    for name, data, shape in MODELS:
        model = build_model(name, input_shape=shape, num_classes=10)
        runs, seconds = [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            runs.append(measure(model, classification_example(shape, 10), args.batch, device, precisions))
            seconds.append(time.perf_counter() - t0)
        timings = {p: statistics.median(r[p] for r in runs) for p in precisions}
        print(f"{name:<10} {data:<8} " + " ".join(f"{timings[p] * 1e3:>10.2f}" for p in precisions)
              + f" {choose(timings):>7} {statistics.median(seconds):>10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
