"""Pooled figures of several ``micro_ab.py`` invocations (issue 31): each comparison's median over every run of
every invocation, its range, and each invocation's own median, before and after.

    python benchmarks/micro_ab_pool.py DIR [DIR ...] [--only PREFIX,...]

Each DIR is one invocation's ``--out`` (its ``before-N`` and ``after-N`` runs' ``micro.json``). Printed per
comparison: the ratio to the bare baseline before and after (pooled median and range), after by invocation, and
our value after / before (pooled medians, and by invocation).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from micro_ab import rows_of  # noqa: E402

Runs = dict[str, list[dict[str, tuple[float, float]]]]


def load(out: Path) -> Runs:
    """side -> one rows_of() a run, in run order."""
    runs: Runs = {"before": [], "after": []}
    for side in runs:
        paths = sorted(out.glob(f"{side}-*/micro.json"), key=lambda p: int(p.parent.name.rsplit("-", 1)[1]))
        runs[side] = [rows_of(json.loads(p.read_text())) for p in paths]
    return runs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dirs", nargs="+", type=Path)
    p.add_argument("--only", default="CPU, push", help="comparisons starting with these (comma-separated)")
    args = p.parse_args(argv)
    invocations = [load(d) for d in args.dirs]
    prefixes = tuple(args.only.split(","))
    names = [n for n in invocations[0]["after"][0] if n.startswith(prefixes)] if invocations[0]["after"] else []
    for name in names:
        pooled: dict[str, list[tuple[float, float]]] = {"before": [], "after": []}
        by_inv, ours_by_inv = [], []
        for inv in invocations:
            sides = {s: [r[name] for r in inv[s] if name in r] for s in ("before", "after")}
            for s, vals in sides.items():
                pooled[s].extend(vals)
            by_inv.append(statistics.median(v[1] for v in sides["after"]))
            ours_by_inv.append(statistics.median(v[0] for v in sides["after"])
                               / statistics.median(v[0] for v in sides["before"]))
        ratio = {s: [v[1] for v in pooled[s]] for s in pooled}
        ours = {s: statistics.median(v[0] for v in pooled[s]) for s in pooled}
        print(f"{name}: x bare before {statistics.median(ratio['before']):.2f} "
              f"({min(ratio['before']):.2f}-{max(ratio['before']):.2f}), after "
              f"{statistics.median(ratio['after']):.2f} ({min(ratio['after']):.2f}-{max(ratio['after']):.2f}); "
              f"after by invocation {', '.join(f'{r:.2f}' for r in by_inv)}; ours {ours['before']:.3f} -> "
              f"{ours['after']:.3f} ms ({ours['after'] / ours['before']:.2f}; by invocation "
              f"{', '.join(f'{r:.2f}' for r in ours_by_inv)}); runs {len(ratio['before'])}+{len(ratio['after'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
