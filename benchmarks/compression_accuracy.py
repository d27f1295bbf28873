"""Accuracy with each push codec, in one process: K workers take turns (asynchronous, one push at a time), each
training ``steps`` SGD steps from the global model and pushing its change through the codec (error feedback on);
the global model adds what the codec delivers. The real codecs, not the real system: a first look at what each
codec costs in accuracy, side by side on the same seed and data order.

    python benchmarks/compression_accuracy.py [--dataset digits] [--model cnn] [--rounds 150]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch

from hermes.common.builtin_task import DATASET_SHAPES
from hermes.common.config import build_config
from hermes.common.datasets import load_dataset
from hermes.common.models import build_model
from hermes.common.policies import base as policies
from hermes.common.tensors import flatten, load_flat, spec_of


def run(codec: str, dataset: str, model_name: str, rounds: int, workers: int, steps: int, lr: float,
        seed: int, sets: dict[str, Any] | None = None, model_kwargs: dict[str, Any] | None = None,
        num_samples: int | None = None) -> dict[str, float]:
    torch.manual_seed(seed)
    train, test = load_dataset(dataset, seed=seed, num_samples=num_samples)
    shape, classes = DATASET_SHAPES[dataset]
    model = build_model(model_name, input_shape=shape, num_classes=classes, **(model_kwargs or {}))
    spec = spec_of(model, model_name)
    cfg = build_config("asp", **{"compression.push": codec, **(sets or {})})
    codecs = [policies.build("compression", codec, cfg.core, cfg.sections()) for _ in range(workers)]
    glob = flatten(model).clone()
    x, y = torch.from_numpy(train.x), torch.from_numpy(train.y)
    xt, yt = torch.from_numpy(test.x), torch.from_numpy(test.y)
    g = torch.Generator().manual_seed(seed)
    sent = 0
    for r in range(rounds):
        k = r % workers
        load_flat(model, glob)
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        for _ in range(steps):
            idx = torch.randint(0, len(x), (32,), generator=g)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
        delta = flatten(model) - glob
        c = codecs[k]
        if c is None:
            glob += delta
            sent += 4 * delta.numel()
        else:
            from hermes.common.codecs import decode

            enc = c.encode(delta, spec.shapes)
            glob += decode(enc.data, enc.spec, spec.shapes)
            sent += enc.nbytes
    load_flat(model, glob)
    model.eval()
    with torch.no_grad():
        acc = float((model(xt).argmax(1) == yt).float().mean())
    return {"accuracy": acc, "bytes_per_push": sent / rounds, "bytes_vs_fp32": sent / rounds / (4 * spec.numel)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="digits")
    p.add_argument("--model", default="cnn")
    p.add_argument("--rounds", type=int, default=150)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--codecs", default="none,fp16,int8,topk,powersgd", help="comma-separated push codecs")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="codec parameters, e.g. topk.ratio=0.05 (JSON values)")
    p.add_argument("--model-kwargs", default="{}", help="the model's keyword arguments, JSON")
    p.add_argument("--num-samples", type=int, default=None)
    a = p.parse_args()
    torch.set_num_threads(1)
    sets = {k: json.loads(v) for k, _, v in (kv.partition("=") for kv in a.set)}
    for codec in a.codecs.split(","):
        t0 = time.perf_counter()
        res = [run(codec, a.dataset, a.model, a.rounds, a.workers, a.steps, a.lr, s, sets,
                   json.loads(a.model_kwargs), a.num_samples) for s in range(a.seeds)]
        accs = sorted(r["accuracy"] for r in res)
        print(json.dumps({"codec": codec, "accuracy_median": accs[len(accs) // 2], "accuracies": accs,
                          "bytes_vs_fp32": res[0]["bytes_vs_fp32"], "seconds": round(time.perf_counter() - t0, 1)}),
              flush=True)


if __name__ == "__main__":
    main()
