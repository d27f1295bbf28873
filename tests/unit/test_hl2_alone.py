"""Issue 31's hl2-alone comparison: how `alone` is timed from launch, and the per-agent breakdown's arithmetic."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hermes.deploy.ddp_rank import process_started_at


def test_process_start_is_read_from_proc_for_a_process_started_now() -> None:
    before = time.time()
    code = "from hermes.deploy.ddp_rank import process_started_at; print(process_started_at())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    after = time.time()
    started = float(out)
    # /proc's start tick is 10 ms, its uptime 10 ms: a child spawned between the two clocks reads between them.
    assert before - 0.05 <= started <= after
    here = process_started_at()
    assert here is not None and here < before  # this test process started before it ran


def _write_run(root: Path, key: str, summary: dict[str, object], log: str = "") -> dict[str, object]:
    run_dir = root / "runs" / key
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "summary.json").write_text(json.dumps(summary))
    (run_dir / "logs" / "worker-1.log").write_text(log)
    return {"key": key, "run_dir": f"runs/{key}", "events": {"train_seconds_to_target": 7.5}}


def test_breakdown_reads_both_clocks_and_leaves_shards_out_of_the_pull_bytes(tmp_path: Path) -> None:
    worker = {"name": "worker-1", "speed": 1.0, "cycles": 10, "samples": 1280, "compute_seconds": 6.0,
              "wait_seconds": 1.0, "prefetch_wait_seconds": 0.5, "pushes": 4, "pulls": 5, "bytes_sent": 400,
              "bytes_received": 1500, "shard_bytes_fetched": 1000, "log": "logs/worker-1.log"}
    runs = [_write_run(tmp_path, "hl2@lte/hermes/r0",
                       {"workers": [worker], "seconds_to_target": 11.0, "model_updates": 3, "final_accuracy": 0.91},
                       "x overlapped exchanges: 4.25s in flight, 0.10s waited for\n"),
            _write_run(tmp_path, "hl2@lte/alone/r0",
                       {"preset": "ddp", "workers": [{"name": "rank-0", "samples": 640}], "seconds_to_target": 9.0,
                        "launch_seconds_to_target": 12.5, "final_accuracy": 0.9})]
    (tmp_path / "results.json").write_text(json.dumps({"runs": runs}))
    out = subprocess.run([sys.executable, "benchmarks/hl2_alone_breakdown.py", str(tmp_path), "--agents"],
                         capture_output=True, text=True, check=True, cwd=Path(__file__).parents[2]).stdout
    rows = {line.split("|")[2].strip(): line for line in out.splitlines() if line.startswith("| hl2@lte |")}
    assert "| 7.5 [7.5-7.5] | 11.0 [11.0-11.0] | 1,280 [1,280-1,280] |" in rows["hermes"]
    assert "| 7.5 [7.5-7.5] | 12.5 [12.5-12.5] | 640 [640-640] |" in rows["alone"]
    agent = next(line for line in out.splitlines() if line.startswith("| hl2@lte/hermes/r0 | worker-1"))
    cells = [c.strip() for c in agent.strip("|").split("|")]
    # in flight from the log; 400 B / 4 pushes; (1500 - 1000 shard bytes) / 5 pulls
    assert cells[8] == "4.25" and cells[11] == "100.00" and cells[12] == "100.00"


def test_the_hl2_cluster_is_evaluated_on_a_grid_close_to_alone_s() -> None:
    from hermes.deploy.bench.runner import plan
    from hermes.deploy.bench.suites import builtin_suite

    suite = builtin_suite("hl2-alone")
    spec = next(s for s in plan(suite) if s.variant.label == "hermes-topk" and s.link == "lte")
    args = spec.testbed_args(suite, Path("/tmp/x"))
    # alone checks every 5 steps (about 0.08 s at pace 4); the server's default 1 s grid added about 0.5 s on
    # average to the cluster's time to target.
    assert "eval_interval_seconds=0.25" in args
    alone = next(s for s in plan(suite) if s.variant.label == "alone")
    a_args = alone.testbed_args(suite, Path("/tmp/x"))
    assert a_args[a_args.index("--ddp-eval-every") + 1] == "5"


def test_local_task_deals_disjoint_parts_without_the_servers_validation_samples() -> None:
    import numpy as np

    from hermes.common.datasets import validation_indices
    from hermes.deploy.bench.local_task import device_part, part_indices

    parts = [part_indices(1000, 4, p, 0.1, 0) for p in range(4)]
    held = set(validation_indices(1000, 0.1, 0)[1].tolist())
    union = set(np.concatenate(parts).tolist())
    assert sum(len(p) for p in parts) == len(union) == 900  # disjoint, every train sample once
    assert not union & held  # the loss probe's samples stay off the devices
    assert [device_part(f"worker-{i}", 4) for i in (1, 2, 3, 4, 5)] == [0, 1, 2, 3, 0]
    assert device_part("edge-box", 4) == device_part("edge-box", 4)


def test_local_task_gives_each_agent_its_part_and_keeps_the_builtin_splits_for_alone() -> None:
    from hermes.common.config import build_config
    from hermes.common.datasets import validation_indices
    from hermes.common.task import dataset_len
    from hermes.common.task_registry import resolve_task

    config = build_config("hermes", dataset="digits", min_workers=4, task="hermes.deploy.bench.local_task:task")
    task = resolve_task(config.task, config)
    assert task.local_data is not None and task.train_data is not None and task.test_data is not None
    sizes = [len(task.local_data(f"worker-{i}")[1]) for i in (1, 2, 3, 4)]
    n_train = dataset_len(task.train_data)
    n_val = len(validation_indices(n_train, config.validation_fraction, config.seed)[1])
    assert sum(sizes) == n_train - n_val and max(sizes) - min(sizes) <= 1


def test_the_hl2_suite_paces_every_run_by_one_nominal_alone_included() -> None:
    from hermes.deploy.bench.runner import plan
    from hermes.deploy.bench.suites import builtin_suite

    # Real devices do not share cores: the cluster's agents must not be slowed for waiting on the emulating
    # machine's (issue 31's fairness rule), and alone must be paced by the same rule and the same nominal cost.
    suite = builtin_suite("hl2-alone").with_changes(nominal_sample_ms=0.1)
    for label in ("alone", "hermes-topk-local"):
        spec = next(s for s in plan(suite) if s.variant.label == label and s.link == "lte")
        args = spec.testbed_args(suite, Path("/tmp/x"))
        assert args[args.index("--slowdown-mode") + 1] == "nominal", label
        assert args[args.index("--nominal-sample-ms") + 1] == "0.1", label
    edge = builtin_suite("edge-lte")
    spec = next(s for s in plan(edge) if s.variant.label == "alone")
    assert "--slowdown-mode" not in spec.testbed_args(edge, Path("/tmp/x"))


def test_exchange_row_counts_updates_and_evaluations_up_to_the_target(tmp_path: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        from hl2_alone_breakdown import exchange_row
    finally:
        sys.path.pop(0)
    events = [
        {"ts": 100.0, "event": "join", "worker": "w1"},
        {"ts": 100.5, "event": "update_applied", "staleness": [0], "weights": [0.5]},
        {"ts": 101.0, "event": "evaluation", "seconds": 0.1},
        {"ts": 101.2, "event": "update_applied", "staleness": [2, 4], "weights": [0.25, 0.75]},
        {"ts": 102.0, "event": "evaluation", "seconds": 0.3},
        {"ts": 102.0, "event": "target_reached"},
        {"ts": 103.0, "event": "update_applied", "staleness": [9], "weights": [1.0]},  # after the target
    ]
    (tmp_path / "events.jsonl").write_text("\n".join(json.dumps(e) for e in events) + "\n{cut")
    row = exchange_row(tmp_path)
    assert row is not None
    assert row["updates"] == 3 and row["stale_p50"] == 2 and row["stale_p90"] == 4
    assert row["evals"] == 2 and abs(row["eval_s"] - 0.4) < 1e-9 and abs(row["eval_share"] - 0.2) < 1e-9
    assert exchange_row(tmp_path / "none") is None


def test_server_threads_reach_the_server_from_the_variant_or_the_suite(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hermes.deploy import testbed
    from hermes.deploy.bench.runner import plan
    from hermes.deploy.bench.suites import builtin_suite
    from hermes.deploy.testbed_cli import build_parser

    suite = builtin_suite("hl2-alone")

    def args(label: str) -> list[str]:
        spec = next(s for s in plan(suite) if s.variant.label == label and s.link == "lte")
        return spec.testbed_args(suite, tmp_path / "x")

    assert "--server-threads" not in args("hermes-topk-local")  # the suite's: torch's default
    a = args("hermes-topk-local-1t")
    assert a[a.index("--server-threads") + 1] == "1"
    assert "--server-threads" not in args("alone")
    suite = suite.model_copy(update={"server_threads": 2})
    a = args("hermes-topk-local")
    assert a[a.index("--server-threads") + 1] == "2"
    assert "--server-threads" not in args("alone")  # the DDP peer's rank sets its own (one thread)
    edge = builtin_suite("edge-lte")
    spec = next(s for s in plan(edge) if s.variant.label == "bsp")
    assert "--server-threads" not in spec.testbed_args(edge, tmp_path / "y")

    # ... and the testbed hands it to the server's torch through OMP_NUM_THREADS, to the server only.
    monkeypatch.setattr(testbed, "wait_healthy", lambda *a, **k: None)
    monkeypatch.chdir(tmp_path)
    seen: list[dict[str, str]] = []
    for argv, want in ((["--server-threads", "1"], "1"), ([], None)):
        bed = testbed.Testbed(build_parser().parse_args(["--out", str(tmp_path / f"run{want}"), *argv]))
        seen.clear()
        monkeypatch.setattr(bed, "_spawn", lambda name, cmd, info, env=None: seen.append(env or {}) or
                            testbed.Proc(name, None, tmp_path / "log", info))  # type: ignore[arg-type]
        bed.start_server()
        assert seen[0].get("OMP_NUM_THREADS") == want


def test_seed_table_takes_medians_and_per_seed_ratios_against_that_seeds_alone(tmp_path: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        from hl2_seeds import table
    finally:
        sys.path.pop(0)
    outs = []
    for k, (alone, hermes) in enumerate(((8.0, 4.0), (10.0, 8.0), (6.0, None))):
        out = tmp_path / f"s{k}"
        out.mkdir()
        runs = [{"variant": "alone", "seed": k, "loadavg_before": [1.5],
                 "summary": {"reached_target": True, "workers": [{"samples": 100}]},
                 "events": {"train_seconds_to_target": alone}},
                {"variant": "hermes", "seed": k, "loadavg_before": [2.0],
                 "summary": {"reached_target": hermes is not None, "workers": [{"samples": 150}, {"samples": 50}]},
                 "events": {"train_seconds_to_target": hermes}}]
        (out / "results.json").write_text(json.dumps({"runs": runs}))
        outs.append(out)
    lines = table(outs)
    alone_row = next(r for r in lines if r.startswith("| `alone`"))
    hermes_row = next(r for r in lines if r.startswith("| `hermes`"))
    assert "| 8.0 |" in alone_row and "1.00x" in alone_row  # median of 8, 10, 6
    # One seed missed the target: no median and no ratio of medians, but the per-seed ratios stay.
    assert "4.0, 8.0, missed | - | - | 2.00, 1.25, - |" in hermes_row and "200 / 200 / 200" in hermes_row
    lines = table(outs[:2])
    assert "| 6.0 | 1.50x |" in next(r for r in lines if r.startswith("| `hermes`"))  # 9.0 / 6.0


def test_bench_pace_flag_slows_the_cluster_and_alone_alike() -> None:
    from hermes.deploy.bench.cli import build_parser, suite_from_args
    from hermes.deploy.bench.runner import plan

    suite = suite_from_args(build_parser().parse_args(["hl2-alone", "--out", "/tmp/x", "--pace", "6"]))
    for label in ("alone", "hermes-topk-local"):
        spec = next(s for s in plan(suite) if s.variant.label == label and s.link == "lte")
        args = spec.testbed_args(suite, Path("/tmp/x"))
        assert args[args.index("--pace") + 1] == "6", label  # HL2's fastest device is hl1's speed
    default = suite_from_args(build_parser().parse_args(["hl2-alone", "--out", "/tmp/x"]))
    assert default.pace == 6.0


def test_seed_table_splits_a_repeats_folder_into_its_seeds(tmp_path: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        from hl2_seeds import table
    finally:
        sys.path.pop(0)
    runs = [{"variant": v, "seed": k, "loadavg_before": [1.0], "summary": {"reached_target": True},
             "events": {"train_seconds_to_target": t}}
            for k, pair in enumerate(((9.0, 3.0), (6.0, 4.0), (12.0, 8.0))) for v, t in zip(("alone", "hermes"), pair)]
    (tmp_path / "results.json").write_text(json.dumps({"runs": runs}))
    row = next(r for r in table([tmp_path]) if r.startswith("| `hermes`"))
    assert "| 3.0, 4.0, 8.0 | 4.0 | 2.25x | 3.00, 1.50, 1.50 |" in row


@pytest.mark.parametrize("label, clients, batches, steps", [
    ("bsp-static-local", 4, [32, 32, 21, 43], 8),
    ("bsp-static-b24-local", 4, [24, 24, 16, 32], 8),
    # Sixteen devices of the HL2 pattern (docs/compression.md, ninth pass): 16 steps a round at batch 16.
    ("bsp-static-b16-h16-topk-local", 16, [16, 16, 11, 21] * 4, 16),
])
def test_the_synchronous_variants_split_batches_so_every_hl2_device_ends_its_round_together(
        label: str, clients: int, batches: list[int], steps: int) -> None:
    from hermes.common.config import build_config
    from hermes.common.policies.allocation.static import static_batches
    from hermes.deploy.bench.runner import plan
    from hermes.deploy.bench.suites import builtin_suite
    from hermes.deploy.profiles import worker_profiles

    suite = builtin_suite("hl2-alone").with_changes(nominal_sample_ms=0.1, clients=clients)
    spec = next(s for s in plan(suite) if s.variant.label == label and s.link == "lan")
    cfg = build_config(spec.variant.preset, dataset=suite.dataset, model=suite.model,
                       **{**suite.overrides, **spec.variant.overrides})
    assert (cfg.sync, cfg.allocation, cfg.aggregation) == ("bsp", "static", "samples")
    assert cfg.cycle_samples // cfg.batch_size == steps  # local steps a round, at every device's own batch
    # The agents declare the profile's cores (deploy/testbed_commands.agent_args), which the split follows
    # (OmniLearn Eq. 4a): a round then takes each device about the same time, batch / speed.
    profiles = worker_profiles("hl2", suite.clients)
    args = spec.testbed_args(suite, Path("/tmp/x"))
    assert args[args.index("--profile") + 1] == "hl2"
    split = static_batches([wp.cores for wp in profiles], suite.clients * cfg.batch_size)
    assert split == batches
    per_round = [b / wp.speed for b, wp in zip(split, profiles)]
    assert max(per_round) / min(per_round) < 1.05  # whole samples: 11 / 0.5 against 21 / 1
