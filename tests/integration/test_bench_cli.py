"""hermes-bench end to end: a tiny real suite (2 presets x 1 repeat, short budget) through the CLI."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def bench(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hermes.deploy.bench", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_tiny_suite_end_to_end_then_resume(tmp_path):
    suite = tmp_path / "tiny.toml"
    suite.write_text('presets = ["bsp", "hermes"]\nprofiles = ["hl8"]\nclients = 2\nrepeats = 1\n'
                     'target_accuracy = 0.8\nmax_seconds = 8\n')
    out = tmp_path / "out"
    proc = bench("run", str(suite), "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # Every suite measures the fastest device alone too (issue 31): the third run.
    assert "[1/3] hl8/bsp/r0" in proc.stdout and "[2/3] hl8/hermes/r0" in proc.stdout
    assert "[3/3] hl8/alone/r0" in proc.stdout and "ETA" in proc.stdout

    results = json.loads((out / "results.json").read_text())
    assert [r["key"] for r in results["runs"]] == ["hl8/bsp/r0", "hl8/hermes/r0", "hl8/alone/r0"]
    for r in results["runs"]:
        assert r["status"] == "ok", r
        on_disk = json.loads((out / r["run_dir"] / "summary.json").read_text())
        assert r["summary"] == on_disk
        if r["key"].endswith("/alone/r0"):  # one device, the DDP peer with one rank, at the profile's top speed
            assert on_disk["clients"] == 1 and on_disk["preset"] == "ddp"
        else:
            assert on_disk["preset"] == r["preset"] and on_disk["clients"] == 2
    assert results["machine"]["cpu_count"] and results["versions"]["torch"]

    report = (out / "report.md").read_text()
    for r in results["runs"]:
        s = r["summary"]
        row = next(line for line in report.splitlines() if line.startswith(f"| `{r['key']}`"))
        assert f"| {s['wall_seconds']:.1f} |" in row and f"| {s['model_updates']} |" in row
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert len(pngs) >= 3, pngs
    for name in pngs:
        data = (out / name).read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 5000, name
        assert f"({name})" in report

    # Second invocation: nothing re-run, same summaries.
    mtimes = {p: p.stat().st_mtime for p in out.glob("runs/*/*/*/summary.json")}
    again = bench("run", str(suite), "--out", str(out))
    assert again.returncode == 0, again.stderr[-3000:]
    # Nothing re-run is told by the counts and the untouched summaries, not by the wall clock (issue 32).
    assert "3 already finished" in again.stdout and "0 to run" in again.stdout
    assert {p: p.stat().st_mtime for p in mtimes} == mtimes

    # The report re-renders from results.json alone.
    (out / "report.md").unlink()
    rendered = bench("report", str(out))
    assert rendered.returncode == 0, rendered.stderr
    assert (out / "report.md").read_text() == report


def test_unknown_presets_are_refused_before_any_run(tmp_path):
    suite = tmp_path / "suite.toml"
    suite.write_text('presets = ["bsp", "no-such-preset"]\nprofiles = ["hl8"]\nrepeats = 1\n')
    proc = bench("run", str(suite), "--out", str(tmp_path / "o"), timeout=60)
    assert proc.returncode == 2
    assert "unknown preset(s)" in proc.stderr and "no-such-preset" in proc.stderr
    assert not (tmp_path / "o" / "runs").exists()


def _processes_naming(needle: str) -> list[int]:
    """Pids whose command line mentions ``needle`` (the run's own out dir: nothing else names it)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if needle.encode() in cmdline:
                pids.append(int(entry.name))
    return pids


@pytest.mark.parametrize("sig", [pytest.param(signal.SIGTERM, marks=pytest.mark.slow), signal.SIGKILL])
def test_a_killed_bench_leaves_no_testbed_behind(tmp_path, sig):
    suite = tmp_path / "one.toml"
    suite.write_text('presets = ["bsp"]\nprofiles = ["hl8"]\nclients = 2\nrepeats = 1\nmax_seconds = 120\n'
                     'target_accuracy = 0.99\n')
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "hermes.deploy.bench", "run", str(suite), "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        # Killed mid-run: once the testbed's agents train (the agent logs exist and say so).
        deadline = time.monotonic() + 120
        while not any("registered" in p.read_text(errors="replace") for p in out.glob("runs/*/*/*/logs/worker-*.log")):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0][-3000:]
            time.sleep(0.2)
        assert len(_processes_naming(str(out))) >= 3  # testbed, server, agents
        proc.send_signal(sig)
        proc.wait(timeout=60)
        deadline = time.monotonic() + 60
        while _processes_naming(str(out)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _processes_naming(str(out)) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if sig == signal.SIGTERM:
        assert proc.returncode == 130 and "interrupted; finished runs are kept" in proc.stdout.read()
