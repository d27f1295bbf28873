"""``hermes-bench``: run a matrix of testbed runs and turn it into a report with plots.

    hermes-bench quick --out DIR                 # hermes, asp, bsp at HL8: under five minutes
    hermes-bench paper-hermes --out DIR          # Hermes Table III shape (speed-up over BSP)
    hermes-bench paper-omnilearn --out DIR       # uniform / variable / dynamic batching across HL1-HL8
    hermes-bench run SUITE.toml --out DIR        # a suite of your own
    hermes-bench report DIR                      # re-render report.md and the plots from results.json
    hermes-bench micro --out DIR                 # hot paths against bare baselines
    hermes-bench list                            # the built-in suites

Re-running a suite with the same ``--out`` skips the runs that finished.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hermes.common.cli_env import HermesParser
from hermes.deploy.bench.suites import (
    BUILTIN,
    Suite,
    SuiteError,
    builtin_suite,
    check_runnable,
    load_suite,
    runnable_part,
)

log = logging.getLogger(__name__)


def _say(line: str) -> None:
    print(f"[hermes-bench {time.strftime('%H:%M:%S')}] {line}", flush=True)


def add_suite_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="output directory (results.json, report.md, PNGs, runs/)")
    p.add_argument("--repeats", type=int, help="runs per variant and profile, seeds SEED..SEED+N-1")
    p.add_argument("--profiles", help="comma-separated heterogeneity profiles, e.g. hl1,hl8")
    p.add_argument("--links", help="comma-separated emulated links of the agents, e.g. lan,lte (hermes-testbed --link)")
    p.add_argument("--variants", help="comma-separated variant labels to keep from the suite")
    p.add_argument("--clients", type=int, help="agents per run")
    p.add_argument("--dataset", help="data set of every run")
    p.add_argument("--model", help="model of every run")
    p.add_argument("--target-accuracy", type=float, help="stop a run at this test accuracy")
    p.add_argument("--max-seconds", type=float, help="wall-clock budget of each run")
    p.add_argument("--seed", type=int, help="seed of the first repeat")
    p.add_argument("--churn", metavar="SPEC", help="agents leave and come back in every run (hermes-testbed --churn)")
    p.add_argument("--slowdown-mode", choices=("cpu", "floor", "nominal"),
                   help="how every run's emulated devices slow down, alone included (hermes-testbed "
                        "--slowdown-mode; default: the suite's: cpu, nominal for hl2-alone)")
    p.add_argument("--nominal-sample-ms", type=float,
                   help="slowdown mode nominal: every device's cost per sample in ms (default: measured once per "
                        "invocation before the runs, deploy/bench/nominal.py)")
    p.add_argument("--pace", type=float,
                   help="every device slowed alike by this factor, alone included (hermes-testbed --pace; default: the "
                        "suite's)")
    p.add_argument("--skip-unknown", action="store_true",
                   help="run the variants whose presets exist here and leave out the others (default: refuse)")
    p.add_argument("--dry-run", action="store_true", help="print the runs and exit")


def build_parser() -> argparse.ArgumentParser:
    p = HermesParser(prog="hermes-bench", version=True, env_prefix="HERMES_BENCH_",
                     description=__doc__.split("\n\n")[0],
                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    sub = p.add_subparsers(dest="command", required=True)
    for name in BUILTIN:
        add_suite_arguments(sub.add_parser(name, help=BUILTIN[name]["description"].split(":")[0]))
    run = sub.add_parser("run", help="a suite from a TOML or JSON file")
    run.add_argument("suite_file")
    add_suite_arguments(run)
    rep = sub.add_parser("report", help="re-render report.md and the plots from DIR/results.json")
    rep.add_argument("dir")
    # The microbenchmarks reach into the server's and the agent's internals, which deploy may not
    # import: they live in the checkout's benchmarks/ and run there, with their own flags.
    micro = sub.add_parser("micro", add_help=False,
                           help="microbenchmarks: our hot paths against bare baselines (from a repo checkout; "
                                "hermes-bench micro --help for its flags)")
    micro.add_argument("micro_args", nargs=argparse.REMAINDER)
    sub.add_parser("list", help="the built-in suites")
    return p


def suite_from_args(args: argparse.Namespace) -> Suite:
    suite = load_suite(args.suite_file) if args.command == "run" else builtin_suite(args.command)
    suite = suite.with_changes(
        repeats=args.repeats, clients=args.clients, dataset=args.dataset, model=args.model,
        target_accuracy=args.target_accuracy, max_seconds=args.max_seconds, seed=args.seed, churn=args.churn,
        slowdown_mode=args.slowdown_mode, pace=args.pace, nominal_sample_ms=args.nominal_sample_ms,
        profiles=[x.strip() for x in args.profiles.split(",") if x.strip()] if args.profiles else None,
        links=[x.strip() for x in args.links.split(",") if x.strip()] if args.links else None,
    )
    if args.variants:
        suite = suite.only_variants([x.strip() for x in args.variants.split(",") if x.strip()])
    return suite


def render(out: Path, results: dict[str, Any]) -> list[Path]:
    from hermes.deploy.bench.plots import render_plots
    from hermes.deploy.bench.report import render_report

    pngs = render_plots(results, out)
    (out / "report.md").write_text(render_report(results))
    return pngs


def cmd_suite(args: argparse.Namespace) -> int:
    from hermes.deploy.bench.runner import ProbeError, execute, plan

    try:
        suite = suite_from_args(args)
    except SuiteError as exc:
        print(f"hermes-bench: {exc}", file=sys.stderr)
        return 2
    problems = check_runnable(suite)
    if problems and args.skip_unknown:
        kept, dropped = runnable_part(suite)
        if kept is None:
            print(f"hermes-bench: nothing to run: {'; '.join(problems)}", file=sys.stderr)
            return 2
        _say(f"leaving out variants {dropped}: {problems[0]}")
        suite, problems = kept, check_runnable(kept)
    if problems:
        for line in problems:
            print(f"hermes-bench: suite {suite.name}: {line}", file=sys.stderr)
        if any(line.startswith("unknown preset") for line in problems):
            print("hermes-bench: --skip-unknown runs the other variants", file=sys.stderr)
        return 2
    if args.dry_run:
        if suite.slowdown_mode == "nominal" and suite.nominal_sample_ms is None and suite.engine == "testbed":
            print("# --nominal-sample-ms: measured before the first run (deploy/bench/nominal.py), then passed to every run")
        for spec in plan(suite):
            command = "hermes-sim" if suite.engine == "sim" else "hermes-testbed"
            print(f"{spec.key}: {command} {' '.join(spec.args(suite, spec.run_dir(Path(args.out))))}")
        return 0
    out = Path(args.out).resolve()
    # SIGTERM (kill, a CI timeout) takes the same path as Ctrl-C: the running testbed's group is
    # stopped and finished runs are kept.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        results = execute(suite, out, progress=_say)
    except KeyboardInterrupt:
        _say(f"interrupted; finished runs are kept in {out}: run the same command again to resume")
        return 130
    except ProbeError as exc:
        print(f"hermes-bench: {exc}; no run started, set --nominal-sample-ms to skip the probe", file=sys.stderr)
        return 2
    pngs = render(out, results)
    _say(f"wrote {out / 'results.json'}, {out / 'report.md'} and {len(pngs)} plots")
    return 0 if all(r["status"] == "ok" for r in results["runs"]) else 1


def cmd_report(args: argparse.Namespace) -> int:
    from hermes.deploy.bench.runner import refresh_events

    out = Path(args.dir)
    try:
        results = json.loads((out / "results.json").read_text())
    except (OSError, ValueError) as exc:
        print(f"hermes-bench report: cannot read {out / 'results.json'}: {exc}", file=sys.stderr)
        return 2
    refreshed = refresh_events(out, results)
    if refreshed:
        _say(f"{refreshed} run(s) timed again from their event logs (results.json left as written)")
    pngs = render(out, results)
    _say(f"wrote {out / 'report.md'} and {len(pngs)} plots")
    return 0


def benchmarks_dir() -> Path | None:
    """The checkout's ``benchmarks/`` (HERMES_BENCHMARKS_DIR, or beside this package's source folder)."""
    env = os.environ.get("HERMES_BENCHMARKS_DIR")
    candidates = [Path(env)] if env else []
    # deploy/bench/cli.py in a checkout (or an editable install): the repo root is two folders up.
    candidates.append(Path(__file__).resolve().parents[2] / "benchmarks")
    return next((c for c in candidates if (c / "micro.py").is_file()), None)


def cmd_micro(micro_args: list[str]) -> int:
    where = benchmarks_dir()
    if where is None:
        print("hermes-bench micro: needs a repository checkout (benchmarks/micro.py is not installed): run it from "
              "a clone installed with pip install -e, or set HERMES_BENCHMARKS_DIR to the clone's benchmarks folder",
              file=sys.stderr)
        return 2
    return subprocess.call([sys.executable, str(where / "micro.py"), *micro_args])


def cmd_list() -> int:
    for name in BUILTIN:
        s = builtin_suite(name)
        problems = check_runnable(s)
        print(f"{name}: {len(s.variants)} variants ({', '.join(v.label for v in s.variants)}) x "
              f"{len(s.profiles)} profiles ({', '.join(s.profiles)}) x {s.repeats} repeats; "
              f"target {s.target_accuracy}, max {s.max_seconds:g} s per run")
        print(f"    {s.description}")
        for line in problems:
            print(f"    not runnable here as is: {line}")
    return 0


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["micro"]:
        return cmd_micro(argv[1:])  # its flags are the script's own
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "report":
        return cmd_report(args)
    if args.command == "list":
        return cmd_list()
    return cmd_suite(args)


if __name__ == "__main__":
    sys.exit(main())
