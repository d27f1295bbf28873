"""Rewrite a hermes-bench folder's results.json from the runs on disk, running nothing.

    python benchmarks/bench_recollect.py BENCH_DIR

For a bench interrupted, or one whose run folders were removed to be redone: the suite is the one in
results.json; every planned run with a finished summary.json of the same identity is collected, the rest
left out. Then ``hermes-bench report BENCH_DIR`` renders it.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from hermes.deploy.bench.runner import collect, is_finished, plan, write_results
from hermes.deploy.bench.suites import build_suite


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    out = Path(argv[0]).resolve()
    suite = build_suite(json.loads((out / "results.json").read_text())["suite"])
    runs = [collect(s, suite, out) for s in plan(suite) if is_finished(s, suite, out)]
    write_results(out, suite, runs, time.time())
    print(f"{out / 'results.json'}: {len(runs)} of {len(plan(suite))} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
