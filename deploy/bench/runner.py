"""Run a suite's matrix of testbed runs, one subprocess each, resumably.

Each run is ``python -m hermes.deploy.testbed ... --out OUT/runs/PROFILE/LABEL/rN --quiet``
in a process group of its own (``python -m hermes.sim.cli ...`` for a suite with
``engine = "sim"``), so runs are isolated from each other and from this process. A run is finished when its ``summary.json`` exists and its
``run.json`` describes the same run (same preset, overrides, seed, budget...);
anything else in its directory is a half-written or outdated run and is
redone from scratch. ``results.json`` is rewritten after every run, so an
interrupted bench leaves what it finished readable.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hermes.common.atomic_write import write_atomic
from hermes.common.clock import SYSTEM_CLOCK, Clock
from hermes.common.readable_json import read_object
from hermes.deploy.bench.aggregate import event_figures
from hermes.deploy.bench.machine import loadavg, machine_info, versions
from hermes.deploy.bench.suites import OWN_LINKS, Suite, Variant
from hermes.deploy.procs import die_with_parent, terminate_group
from hermes.deploy.profiles import worker_profiles

log = logging.getLogger(__name__)

RESULTS_FORMAT = 1


@dataclass(frozen=True)
class RunSpec:
    variant: Variant
    profile: str
    repeat: int
    seed: int
    link: str = "lan"

    @property
    def cell(self) -> str:
        """The report's column: the profile, with its link unless lan."""
        return self.profile if self.link == "lan" else f"{self.profile}@{self.link}"

    @property
    def key(self) -> str:
        return f"{self.cell}/{self.variant.label}/r{self.repeat}"

    def run_dir(self, out: Path) -> Path:
        return out / "runs" / self.cell.replace(":", "_").replace("/", "_") / self.variant.label / f"r{self.repeat}"

    def identity(self, suite: Suite) -> dict[str, Any]:
        """Everything that changes what the run measures: a finished run is reused only if this matches."""
        return {
            "preset": self.variant.preset,
            "overrides": {**suite.overrides, **self.variant.overrides},
            "profile": self.profile, "clients": suite.clients, "dataset": suite.dataset, "model": suite.model,
            "seed": self.seed, "target_accuracy": suite.target_accuracy, "max_seconds": suite.max_seconds,
            # Only where they differ from the default: runs finished before these existed stay finished.
            **({"link": self.link} if self.link != "lan" else {}),
            **({"runner": self.variant.runner} if self.variant.runner != "testbed" else {}),
            **({"homogeneous": True} if self.variant.homogeneous else {}),
            **({"screening": False} if not self.variant.screening else {}),
            **({"churn": suite.churn} if suite.churn else {}),
            **({"engine": "sim", "server_cost": suite.server_cost} if suite.engine == "sim" else {}),
            **({"jitter": suite.jitter} if suite.engine == "sim" and suite.jitter else {}),
            **({"pace": suite.pace} if suite.pace != 1.0 else {}),
            **({"slowdown_mode": suite.slowdown_mode, "nominal_sample_ms": suite.nominal_sample_ms}
               if suite.slowdown_mode == "nominal" else {}),
            **({"ddp_eval_every": suite.ddp_eval_every}
               if suite.ddp_eval_every != 20 and self.variant.runner != "testbed" else {}),
            **({"ddp_hook": self.variant.ddp_hook, "ddp_powersgd_rank": self.variant.ddp_powersgd_rank}
               if self.variant.ddp_hook != "allreduce" else {}),
        }

    def testbed_args(self, suite: Suite, run_dir: Path) -> list[str]:
        profile, clients, pace = self.profile, suite.clients, suite.pace
        if self.variant.runner == "alone":
            # The fastest device by itself: one rank at the profile's top speed (its slowdown times the pace of
            # the cluster, so alone and cluster run at the same emulated pace), no link to cross.
            fastest = min(wp.slowdown for wp in worker_profiles(self.profile, suite.clients))
            profile, clients, pace = "hl1", 1, fastest * suite.pace
        if self.variant.homogeneous:
            # The same sum of speeds spread evenly: every agent at the mean speed (hl1 slowed by the pace).
            speeds = [wp.speed for wp in worker_profiles(self.profile, suite.clients)]
            profile, pace = "hl1", suite.clients / sum(speeds) * suite.pace
        args = ["--clients", str(clients), "--profile", profile, "--preset", self.variant.preset,
                "--dataset", suite.dataset, "--model", suite.model, "--seed", str(self.seed),
                "--max-seconds", f"{suite.max_seconds:g}", "--out", str(run_dir), "--quiet"]
        if suite.target_accuracy is not None:
            args += ["--target-accuracy", f"{suite.target_accuracy:g}"]
        if pace != 1:
            args += ["--pace", f"{pace:.6g}"]
        if suite.slowdown_mode != "cpu":
            args += ["--slowdown-mode", suite.slowdown_mode]
        if suite.slowdown_mode == "nominal" and suite.nominal_sample_ms is not None:
            args += ["--nominal-sample-ms", f"{suite.nominal_sample_ms:.6g}"]
        server_threads = self.variant.server_threads or suite.server_threads
        if server_threads is not None and self.variant.runner == "testbed":
            args += ["--server-threads", str(server_threads)]
        if self.variant.runner in ("ddp", "alone"):
            args += ["--peer", "ddp"]
        if self.variant.ddp_hook != "allreduce":
            args += ["--ddp-hook", self.variant.ddp_hook, "--ddp-powersgd-rank", str(self.variant.ddp_powersgd_rank)]
        if self.variant.runner in ("ddp", "alone") and suite.ddp_eval_every != 20:
            args += ["--ddp-eval-every", str(suite.ddp_eval_every)]
        if self.link != "lan" and self.variant.runner != "alone":
            args += ["--link", self.link]
        if not self.variant.screening and self.variant.runner == "testbed":
            args += ["--screening", "off"]
        if suite.churn and self.variant.runner == "testbed":
            args += ["--churn", suite.churn]
        for k, v in {**suite.overrides, **self.variant.overrides}.items():
            args += ["--set", f"{k}={json.dumps(v) if not isinstance(v, str) else v}"]
        return args


    def sim_args(self, suite: Suite, run_dir: Path) -> list[str]:
        """hermes-sim's arguments for this run: the same task, budget and seed on the population ``profile``.

        The peers as the testbed bench runs them, in simulation: ``alone`` is ``--alone`` (the population's
        fastest device, all data, no link), ``homogeneous`` is ``--homogeneous`` (every device at the mean
        FLOP/s), and the DDP peer is bsp with one mini-batch per cycle (``cycle_samples = batch_size``): a
        barrier every step as DDP's all-reduce, its lr from the variant's overrides. Budget and times are
        virtual seconds.
        """
        overrides = {**suite.overrides, **self.variant.overrides}
        if self.variant.runner == "ddp":
            from hermes.common.config import build_config

            batch = build_config(self.variant.preset, dataset=suite.dataset, model=suite.model, **overrides).batch_size
            overrides["cycle_samples"] = batch
        args = ["--population", self.profile, "--devices", str(suite.clients), "--preset", self.variant.preset,
                "--dataset", suite.dataset, "--model", suite.model, "--seed", str(self.seed),
                "--max-seconds", f"{suite.max_seconds:g}", "--server-cost", suite.server_cost,
                "--out", str(run_dir), "--quiet"]
        if suite.target_accuracy is not None:
            args += ["--target-accuracy", f"{suite.target_accuracy:g}"]
        if suite.jitter:
            args += ["--jitter", f"{suite.jitter:g}"]
        if self.variant.runner == "alone":
            args += ["--alone"]
        if self.variant.homogeneous:
            args += ["--homogeneous"]
        if self.link != OWN_LINKS and self.variant.runner != "alone":
            args += ["--link", self.link]
        for k, v in overrides.items():
            args += ["--set", f"{k}={json.dumps(v) if not isinstance(v, str) else v}"]
        return args

    def args(self, suite: Suite, run_dir: Path) -> list[str]:
        return self.sim_args(suite, run_dir) if suite.engine == "sim" else self.testbed_args(suite, run_dir)


def plan(suite: Suite) -> list[RunSpec]:
    """Repeat-major, then profile, then variant: load from other processes on a
    shared machine then falls on every variant alike instead of on whichever ran last."""
    return [RunSpec(v, p, i, suite.seed + i, link)
            for i in range(suite.repeats) for p in suite.profiles for link in suite.links for v in suite.variants]


def is_finished(spec: RunSpec, suite: Suite, out: Path) -> bool:
    d = spec.run_dir(out)
    meta = read_object(d / "run.json")
    return (d / "summary.json").is_file() and meta is not None and meta.get("identity") == spec.identity(suite)


# launcher(testbed args, run dir, timeout seconds) -> (exit code or None on timeout, error text or None)
Launcher = Callable[[list[str], Path, float], tuple[int | None, str | None]]


def launch_testbed(args: list[str], run_dir: Path, timeout: float) -> tuple[int | None, str | None]:
    return launch_module("hermes.deploy.testbed", args, run_dir, timeout, log_name="testbed.log", what="testbed")


def launch_module(module: str, args: list[str], run_dir: Path, timeout: float, *, log_name: str,
                  what: str) -> tuple[int | None, str | None]:
    log_path = run_dir / log_name
    with open(log_path, "wb") as fh:
        env = {k: v for k, v in os.environ.items() if not k.startswith("HERMES_")}
        env["PYTHONUNBUFFERED"] = "1"
        proc = subprocess.Popen([sys.executable, "-m", module, *args], stdout=fh,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, env=env,
                                # A bench killed outright (SIGKILL, a closed terminal) still stops the testbed,
                                # which stops its cluster: its own session would otherwise outlive us.
                                preexec_fn=die_with_parent(signal.SIGTERM))
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            # The testbed stops its own cluster on SIGTERM; the group kill catches what it leaves.
            terminate_group(proc, grace=30.0)
            return None, f"killed after {timeout:.0f}s (see {log_path.name})"
        except BaseException:
            terminate_group(proc, grace=30.0)
            raise
    if code != 0:
        return code, f"{what} exited with {code}: {_tail(log_path)}"
    return code, None


def launch_sim(args: list[str], run_dir: Path, timeout: float) -> tuple[int | None, str | None]:
    """One hermes-sim run in its own process (deploy reaches the simulator through its command line)."""
    return launch_module("hermes.sim.cli", args, run_dir, timeout, log_name="sim.log", what="hermes-sim")


class ProbeError(RuntimeError):
    """The nominal-cost probe failed: no run starts (a one-line error in ``hermes-bench``)."""


def measure_nominal(suite: Suite, timeout: float = 600.0) -> dict[str, Any]:
    """The task's uncontended cost per sample, in a fresh process (deploy/bench/nominal.py): its JSON."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HERMES_")}
    env["OMP_NUM_THREADS"] = "1"
    try:
        done = subprocess.run([sys.executable, "-m", "hermes.deploy.bench.nominal", "--dataset", suite.dataset,
                               "--model", suite.model, "--overrides", json.dumps(suite.overrides)],
                              capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise ProbeError(f"the nominal-cost probe took more than {timeout:g} s") from exc
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ProbeError(f"the nominal-cost probe exited with {done.returncode}: {last}")
    try:
        figure: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        if not float(figure["nominal_sample_ms"]) > 0:
            raise ValueError("nominal_sample_ms must be > 0")
    except (IndexError, KeyError, TypeError, ValueError) as exc:
        raise ProbeError(f"the nominal-cost probe printed no usable figure: {exc}") from exc
    return figure


def with_nominal(suite: Suite, out: Path, probe: Callable[[Suite], dict[str, Any]],
                 progress: Callable[[str], None]) -> Suite:
    """``slowdown_mode = "nominal"`` without a figure: the one of the folder's earlier invocation (its finished
    runs were paced by it), else measured now, before any run."""
    if suite.engine != "testbed" or suite.slowdown_mode != "nominal" or suite.nominal_sample_ms is not None:
        return suite
    previous = read_object(out / "results.json")
    recorded = ((previous or {}).get("suite") or {}).get("nominal_sample_ms")
    if isinstance(recorded, (int, float)) and recorded > 0:
        progress(f"nominal cost {recorded:.6g} ms a sample, as this folder's earlier invocation measured it")
        return suite.with_changes(nominal_sample_ms=float(recorded))
    figure = probe(suite)
    progress(f"nominal cost {figure['nominal_sample_ms']:.6g} ms a sample (median {figure.get('median_sample_ms')}, "
             f"batch {figure.get('batch_size')}, {figure.get('steps')} steps), measured before the runs")
    (out / "nominal.json").write_text(json.dumps({**figure, "loadavg": loadavg()}, indent=1))
    return suite.with_changes(nominal_sample_ms=float(figure["nominal_sample_ms"]))


def execute(suite: Suite, out: Path, *, launcher: Launcher | None = None,
            progress: Callable[[str], None] = lambda line: None, clock: Clock = SYSTEM_CLOCK,
            probe: Callable[[Suite], dict[str, Any]] = measure_nominal) -> dict[str, Any]:
    """Run whatever is not finished yet; return (and write) ``results.json``."""
    if launcher is None:
        launcher = launch_sim if suite.engine == "sim" else launch_testbed
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    suite = with_nominal(suite, out, probe, progress)
    specs = plan(suite)
    todo = [s for s in specs if not is_finished(s, suite, out)]
    todo_keys = {s.key for s in todo}
    done_before = len(specs) - len(todo)
    started = clock.time()
    progress(f"suite {suite.name}: {len(specs)} runs ({len(suite.variants)} variants x {len(suite.profiles)} "
             f"profiles x {suite.repeats} repeats); {done_before} already finished in {out}, {len(todo)} to run")
    records: dict[str, dict[str, Any]] = {}
    durations: list[float] = []
    for spec in specs:
        if spec.key not in todo_keys:
            records[spec.key] = collect(spec, suite, out)
    for n, spec in enumerate(todo, 1):
        eta = _eta(durations, len(todo) - n + 1, suite)
        progress(f"[{done_before + n}/{len(specs)}] {spec.key} (preset {spec.variant.preset}, seed {spec.seed}) "
                 f"... ETA for the rest {_hms(eta)}")
        t0 = time.time()
        records[spec.key] = run_one(spec, suite, out, launcher)
        durations.append(time.time() - t0)
        progress("    " + describe(records[spec.key]))
        write_results(out, suite, [records[s.key] for s in specs if s.key in records], started, clock)
    results = write_results(out, suite, [records[s.key] for s in specs], started, clock)
    failed = sum(1 for r in results["runs"] if r["status"] != "ok")
    progress(f"suite {suite.name}: {len(todo)} runs in {_hms(time.time() - started)}"
             f"{f'; {failed} failed' if failed else ''}")
    return results


def run_one(spec: RunSpec, suite: Suite, out: Path, launcher: Launcher) -> dict[str, Any]:
    d = spec.run_dir(out)
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    meta = {"identity": spec.identity(suite), "key": spec.key, "started_at": time.time(), "loadavg_before": loadavg()}
    (d / "run.json").write_text(json.dumps(meta, indent=2))
    t0 = time.time()
    code, error = launcher(spec.args(suite, d), d, suite.run_timeout)
    meta.update({"elapsed_seconds": round(time.time() - t0, 3), "exit_code": code, "error": error,
                 "loadavg_after": loadavg()})
    if error and (d / "summary.json").is_file():
        # A summary from a testbed that then failed is not a finished run: redo it next time.
        (d / "summary.json").rename(d / "summary.failed.json")
    (d / "run.json").write_text(json.dumps(meta, indent=2))
    return collect(spec, suite, out)


def collect(spec: RunSpec, suite: Suite, out: Path) -> dict[str, Any]:
    d = spec.run_dir(out)
    meta = read_object(d / "run.json") or {}
    summary = read_object(d / "summary.json")
    status = "ok" if summary is not None and not meta.get("error") else "failed"
    return {
        "key": spec.key, "variant": spec.variant.label, "preset": spec.variant.preset,
        "overrides": spec.identity(suite)["overrides"], "profile": spec.cell, "link": spec.link,
        "runner": spec.variant.runner, "homogeneous": spec.variant.homogeneous, "repeat": spec.repeat,
        "seed": spec.seed, "run_dir": str(d.relative_to(out)), "status": status,
        "error": meta.get("error") if status != "ok" else None,
        "testbed_exit": meta.get("exit_code"), "elapsed_seconds": meta.get("elapsed_seconds"),
        "loadavg_before": meta.get("loadavg_before"), "loadavg_after": meta.get("loadavg_after"),
        "summary": summary, "events": event_figures(d / "events.jsonl") if summary is not None else {},
    }


def refresh_events(out: Path, results: dict[str, Any]) -> int:
    """Recompute each run's event figures from its ``events.jsonl`` (kept beside ``results.json``), so
    ``hermes-bench report`` renders older results with today's definitions (issue 17's training time
    from the last join, since 2026-11-26). In memory only: ``results.json`` stays as it was written.
    Runs without an event log (the DDP peer, folders moved away) keep their figures. Returns how many changed."""
    changed = 0
    for r in results.get("runs", []):
        log = out / str(r.get("run_dir") or "") / "events.jsonl"
        if r.get("summary") is None or not r.get("run_dir") or not log.is_file():
            continue
        ev = event_figures(log)
        if ev and ev != r.get("events"):
            r["events"] = ev
            changed += 1
    return changed


def write_results(out: Path, suite: Suite, runs: list[dict[str, Any]], started: float,
                  clock: Clock = SYSTEM_CLOCK) -> dict[str, Any]:
    """Write ``results.json``. Its ``written_at`` (the report's stamp) is when these results first
    took this form: a resumed invocation with nothing new to run keeps the earlier stamp, so the
    report of the same results renders the same whenever it is rendered."""
    suite_json = suite.model_dump(mode="json")
    now = clock.time()
    previous = read_object(out / "results.json")
    unchanged = (previous is not None and previous.get("suite") == suite_json
                 and previous.get("runs") == json.loads(json.dumps(runs)))
    results = {
        "format": RESULTS_FORMAT,
        "suite": suite_json,
        "machine": machine_info(),
        "versions": versions(),
        "written_at": previous.get("written_at", now) if previous is not None and unchanged else now,
        "invocation_seconds": round(now - started, 3),
        "runs": runs,
    }
    write_atomic(out / "results.json", json.dumps(results, indent=1))
    return results


def describe(rec: dict[str, Any]) -> str:
    if rec["status"] != "ok":
        return f"FAILED: {rec.get('error')}"
    s = rec["summary"]
    acc = s.get("final_accuracy")
    target = (f"target reached in {s['seconds_to_target']:.1f}s" if s.get("reached_target")
              else "target not reached")
    outcome = "" if s.get("reached_target") else f"{s.get('outcome')}; "
    return (f"{outcome}{target}; wall {s.get('wall_seconds', 0):.1f}s; "
            f"accuracy {'-' if acc is None else f'{acc:.3f}'}; updates {s.get('model_updates')}; "
            f"messages {s.get('messages_total')} (run took {rec.get('elapsed_seconds') or 0:.0f}s)")


def _eta(durations: list[float], remaining: int, suite: Suite) -> float:
    # Before the first run, guess the budget plus ~15 s of start-up and shutdown.
    per_run = sum(durations) / len(durations) if durations else suite.max_seconds + 15.0
    return per_run * remaining


def _hms(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


def _tail(path: Path, lines: int = 5) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
