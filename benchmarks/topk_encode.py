"""Top-k push encode cost with error feedback, ``topk.selection`` full against sampled, side by side (issue 31).

    python benchmarks/topk_encode.py [--ratios 0.05,0.01] [--reps 21]

The change pushed is edge-resnet's own (1,210,410 parameters plus BatchNorm's statistics, 1,213,162 floats):
its initial model minus the same model after a few SGD steps on synthetic-cifar, so the scales differ by layer as
a real push's do. One torch thread, as an agent. Prints the median and range of ``ErrorFeedback.encode`` in ms
per selection and ratio, interleaved call by call so both see the same load.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch


def pushes(count: int) -> list[torch.Tensor]:
    """``count`` successive changes of edge-resnet (stride-2 stem, as the edge suites) trained by SGD."""
    from hermes.common.datasets import load_dataset
    from hermes.common.models import build_model

    torch.manual_seed(0)
    train, _ = load_dataset("synthetic-cifar", num_samples=512, seed=0)
    model = build_model("edge-resnet", input_shape=train.input_shape, num_classes=train.num_classes, stem_stride=2)
    x, y = torch.from_numpy(train.x[:256]), torch.from_numpy(train.y[:256])
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def flat() -> torch.Tensor:
        return torch.cat([t.detach().reshape(-1).float() for t in model.state_dict().values()
                          if t.is_floating_point()])

    out = []
    for i in range(count):
        before = flat()
        for j in range(2):
            b = slice((2 * i + j) * 32 % 256, (2 * i + j) * 32 % 256 + 32)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[b]), y[b]).backward()
            opt.step()
        out.append(flat() - before)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ratios", default="0.05,0.01")
    ap.add_argument("--reps", type=int, default=21)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    from hermes.common.codecs import ErrorFeedback, TopKCodec

    deltas = pushes(4)
    n = deltas[0].numel()
    shapes = ((n,),)
    print(f"n = {n:,}, torch {torch.__version__}, 1 thread")
    for ratio in (float(r) for r in args.ratios.split(",")):
        codecs = {sel: ErrorFeedback(TopKCodec(ratio, sel)) for sel in ("full", "sampled")}
        times: dict[str, list[float]] = {sel: [] for sel in codecs}
        for rep in range(args.reps):
            for sel, ef in codecs.items():
                t0 = time.perf_counter()
                ef.encode(deltas[rep % len(deltas)], shapes)
                times[sel].append(1e3 * (time.perf_counter() - t0))
        same = all(torch.equal(codecs["full"].codec.encode(d, shapes).data, codecs["sampled"].codec.encode(d, shapes).data)
                   for d in deltas)
        full, samp = statistics.median(times["full"]), statistics.median(times["sampled"])
        fallbacks = codecs["sampled"].codec
        assert isinstance(fallbacks, TopKCodec)
        print(f"ratio {ratio}: full {full:.2f} ms [{min(times['full']):.2f}-{max(times['full']):.2f}], sampled "
              f"{samp:.2f} ms [{min(times['sampled']):.2f}-{max(times['sampled']):.2f}], {full / samp:.2f}x; "
              f"same bytes: {same}; fallbacks {fallbacks.fallbacks}/{args.reps}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
