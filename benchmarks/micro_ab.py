"""Before/after for ``hermes-bench micro``: a base revision's micro suite and this checkout's, alternated.

    python benchmarks/micro_ab.py --base REV [--after REV] [--repeats 5] [--out DIR] [--full]
                                  [--only SECTION,...] [--plane-repeats N]

The base revision is exported (``git archive``) into a temporary directory
laid out as the installed ``hermes`` package, and its own
``benchmarks/micro.py`` runs with that directory first on PYTHONPATH (the
servers it starts inherit it); this checkout's runs as it is. Runs
alternate base, this, base, this, ... so load from other processes hits
both alike. Printed per comparison: the median over the repeats of our time
and of the ratio to the bare baseline, for each side, and after / before.

With ``--after REV`` the after side is that revision, exported when the run
starts (not the working tree), and both sides run the after revision's
``benchmarks/`` (the same bench and baselines, only the measured code
differs): a run queued behind a lock measures the commits of its start.
For the compressed rows the ratio is to the bare pair that also does the
receiver's work (``micro_bare.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("server", "client", "common", "deploy")


def export(rev: str, into: Path) -> Path:
    """``rev``'s tree under ``into/src`` and a ``hermes`` package of it under ``into/pkg``."""
    src, pkg = into / "src", into / "pkg" / "hermes"
    src.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True).stdout
    tar_path = into / "rev.tar"
    tar_path.write_bytes(archive)
    with tarfile.open(tar_path) as tar:
        tar.extractall(src, filter="data")
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text((src / "hermes" / "__init__.py").read_text())
    for name in PACKAGES:
        (pkg / name).symlink_to(src / name, target_is_directory=True)
    return src


def run_once(checkout: Path, pythonpath: Path | None, out: Path, extra: list[str]) -> dict[str, Any]:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    # The working directory comes first on the servers' sys.path (python -m): the package
    # directory for the base, so its ``hermes`` is found and not a checkout's bare hermes/ folder.
    subprocess.run([sys.executable, str(checkout / "benchmarks" / "micro.py"), "--out", str(out.resolve()), *extra],
                   check=True, env=env, cwd=str(pythonpath or checkout), stdout=subprocess.DEVNULL)
    return json.loads((out / "micro.json").read_text())


def rows_of(res: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """comparison -> (our ms, ratio to the bare baseline without authentication)."""
    out = {}
    for r in res.get("apply", []):
        out[f"apply {r['size']} {r['dtype']}"] = (r["decode_validate_apply_ms"], r["ratio_decode_validate_apply"])
    for r in res.get("dataplane", []):
        out[f"{r['op']} {r['size']}"] = (r["server_ms"], r["ratio"])
    for r in res.get("codec", []):
        out[f"codec {r['op']} {r['dtype']}"] = (r["ms"], r["ratio"])
    for r in res.get("compressed_dataplane", []):
        out[r["op"]] = (r["server_ms"], r.get("ratio_auth_apply") or r["ratio_auth"])
        if r.get("cpu"):
            # CPU per request of both processes, every thread: unlike wall time, not grown by waits for a core.
            ours, bare = r["cpu"]["server"], r["cpu"].get("bare_auth_apply", r["cpu"].get("bare_auth"))
            out[f"CPU, {r['op']}"] = (ours, ours / bare)
            if "bare_after_push" in r["cpu"]:
                out[f"CPU, {r['op']}, vs the bare pull after a bare push"] = (ours, ours / r["cpu"]["bare_after_push"])
        if r.get("pieces"):
            pc = r["pieces"]
            out[f"apply, {r['op']}"] = (pc["apply"], pc["apply"] / pc["bare_apply"])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", required=True, help="git revision to compare against (e.g. main, a commit)")
    p.add_argument("--repeats", type=int, default=5, help="runs of each side (default 5; medians are reported)")
    p.add_argument("--out", default="runs/bench-micro-ab", help="directory for every run's micro.json and ab.json")
    p.add_argument("--full", action="store_true", help="the full suite instead of --quick")
    p.add_argument("--after", default=None, help="the after side's revision (default: this working tree)")
    p.add_argument("--only", default=None, help="micro.py --only (its sections; default all)")
    p.add_argument("--plane-repeats", type=int, default=None, help="micro.py --repeats (data-plane rows)")
    args = p.parse_args(argv)
    extra = ([] if args.full else ["--quick"]) + ["--skip-kafka", "--threads", "1"]
    if args.only:
        extra += ["--only", args.only]
    if args.plane_repeats:
        extra += ["--repeats", str(args.plane_repeats)]
    out = Path(args.out)
    runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory(prefix="hermes-micro-ab-") as tmp:
        base_src = export(args.base, Path(tmp) / "base")
        if args.after:
            after_src = export(args.after, Path(tmp) / "after")
            sides = (("before", after_src, Path(tmp) / "base" / "pkg"), ("after", after_src, Path(tmp) / "after" / "pkg"))
        else:
            sides = (("before", base_src, Path(tmp) / "base" / "pkg"), ("after", ROOT, None))
        for i in range(args.repeats):
            for side, checkout, path in sides:
                print(f"run {i + 1}/{args.repeats}: {side}", file=sys.stderr, flush=True)
                runs[side].append(rows_of(run_once(checkout, path, out / f"{side}-{i}", extra)))
    summary = []
    for name in runs["after"][0]:
        if not all(name in r for side in runs.values() for r in side):
            continue
        b_ms = statistics.median(r[name][0] for r in runs["before"])
        a_ms = statistics.median(r[name][0] for r in runs["after"])
        b_ratio = statistics.median(r[name][1] for r in runs["before"])
        a_ratio = statistics.median(r[name][1] for r in runs["after"])
        summary.append({"comparison": name, "before_ms": b_ms, "after_ms": a_ms, "before_ratio": b_ratio,
                        "after_ratio": a_ratio, "after_over_before": a_ms / b_ms})
    (out / "ab.json").write_text(json.dumps({"base": args.base, "repeats": args.repeats, "rows": summary}, indent=1))
    print(f"{'comparison':40s} {'before ms':>10s} {'after ms':>10s} {'after/before':>13s} "
          f"{'x bare before':>14s} {'x bare after':>13s}")
    for s in summary:
        print(f"{s['comparison']:40s} {s['before_ms']:10.2f} {s['after_ms']:10.2f} {s['after_over_before']:13.2f} "
              f"{s['before_ratio']:14.2f} {s['after_ratio']:13.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
