"""Seeing a run live: the /ui page in a real headless browser, /v1/history, offline /docs, TensorBoard files.

One real ``hermes-server`` (preset hermes, ``--protect-reads``,
``--tensorboard``) and two real ``hermes-client`` agents on loopback. The
page is loaded by Debian's chromium (``--dump-dom`` after its scripts ran
for a few seconds of virtual time) and what it shows is checked against
``/v1/status`` and ``/v1/workers``; the browser tests skip only where no
chromium is installed. The event files are read back by TensorBoard's own
``EventAccumulator`` and checked against the server's summary.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ADMIN_TOKEN, JOIN_TOKEN, LiveServer, running_server, wait_for

pytestmark = pytest.mark.integration

AGENTS = ("edge-a", "edge-b")
CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
needs_browser = pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (apt-get install chromium)")


class Page(HTMLParser):
    """What the dashboard shows: text by element id, the workers table by row, the <body> data attributes."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.text: dict[str, str] = {}
        self.body: dict[str, str] = {}
        self.rows: dict[str, list[str]] = {}
        self.svg_text: dict[str, list[str]] = {}
        self.polylines: dict[str, int] = {}
        self._open: list[tuple[str, str | None]] = []
        self._row: list[str] | None = None
        self._row_name = ""
        self._svg: str | None = None
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "body":
            self.body = {k[5:]: v or "" for k, v in a.items() if k.startswith("data-")}
        if tag == "svg":
            self._svg = a.get("id")
        if tag == "polyline" and self._svg:
            self.polylines[self._svg] = self.polylines.get(self._svg, 0) + 1
        if tag == "tr" and a.get("data-worker"):
            self._row, self._row_name = [], a["data-worker"] or ""
        if tag == "td" and self._row is not None:
            self._row.append("")
        if tag not in ("meta", "link", "input", "br", "line", "rect", "polyline"):
            self._open.append((tag, a.get("id")))

    def handle_endtag(self, tag: str) -> None:
        if tag == "tr" and self._row is not None:
            self.rows[self._row_name] = [c.strip() for c in self._row]
            self._row = None
        if tag == "svg":
            self._svg = None
        while self._open:
            if self._open.pop()[0] == tag:
                break

    def handle_data(self, data: str) -> None:
        for _, ident in reversed(self._open):
            if ident:
                self.text[ident] = self.text.get(ident, "") + data
                break
        if self._row is not None and self._row:
            self._row[-1] += data
        if self._svg and self._open and self._open[-1][0] == "text":
            self.svg_text.setdefault(self._svg, []).append(data)


# Columns of the workers table (dashboard.html): name, state, device, speed, samples/s, DSS, batch, accum.,
# utilisation, cycles, last cycle s, pushed, skipped, WI, messages, bytes in, bytes out.
STATE, DSS, BATCH, CYCLES, PUSHED, SKIPPED, MESSAGES = 1, 5, 6, 9, 11, 12, 14


def load(url: str, budget_ms: int = 4000) -> Page:
    """The page's DOM after its scripts ran ``budget_ms`` of virtual time (several 1 s polls)."""
    assert CHROMIUM is not None
    with tempfile.TemporaryDirectory(prefix="hermes-chromium-") as profile:
        r = subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             f"--user-data-dir={profile}", f"--virtual-time-budget={budget_ms}", "--dump-dom", url],
            capture_output=True, text=True, timeout=90,
        )
    assert r.returncode == 0 and "<body" in r.stdout, f"chromium exited {r.returncode}:\n{r.stderr[-3000:]}"
    return Page(r.stdout)


@dataclass
class Run:
    server: LiveServer
    tensorboard: Path
    agents: list[subprocess.Popen] = field(default_factory=list)
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    def read(self, path: str) -> Any:
        return self.server.get_json(path)

    def stop_server(self) -> None:
        """SIGTERM and running_server's checks (clean exit, summary written, ports free)."""
        self.stack.close()


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Iterator[Run]:
    out = tmp_path_factory.mktemp("dashboard")
    stack = contextlib.ExitStack()
    server = stack.enter_context(running_server(
        out, "--preset", "hermes", "--protect-reads", "--tensorboard", str(out / "tb"),
        sets=("eval_interval_seconds=0.5",)))
    server.http.headers["Authorization"] = f"Bearer {JOIN_TOKEN}"
    the_run = Run(server, out / "tb", stack=stack)
    env = {**os.environ, "HERMES_JOIN_TOKEN": JOIN_TOKEN, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    try:
        for name in AGENTS:
            with open(out / f"{name}.log", "wb") as fh:
                the_run.agents.append(subprocess.Popen(
                    [sys.executable, "-m", "hermes.client.cli", "--server", server.url, "--name", name,
                     "--no-progress"], stdout=fh, stderr=subprocess.STDOUT, env=env))
        yield the_run
    finally:
        for a in the_run.agents:
            if a.poll() is None:
                a.kill()
                a.wait(timeout=10)
        stack.close()


def _training(run: Run) -> dict[str, Any]:
    """/v1/status once every agent has trained (and may have left since) and a model has been evaluated."""
    def ready() -> dict[str, Any] | None:
        status = run.read("/v1/status")
        workers = run.read("/v1/workers")
        trained = {w["name"] for w in workers if w["cycles"] >= 2}
        return status if status["evaluation"] and trained >= set(AGENTS) else None

    return wait_for(ready, 120, "both agents to train and an evaluation")


def _still(status: dict[str, Any]) -> dict[str, Any]:
    """The status without its clock, which moves even when the run does not."""
    return {k: v for k, v in status.items() if k != "elapsed_seconds"}


def test_page_and_assets_load_without_token_but_data_does_not(run: Run) -> None:
    http, url = run.server.http, run.server.url
    for path in ("/ui", "/ui/static/dashboard.js", "/ui/static/dashboard.css", "/docs"):
        r = http.get(url + path, headers={"Authorization": ""})
        assert r.status_code == 200, (path, r.status_code)
        # Nothing the pages load comes from elsewhere: an offline edge network shows them whole.
        assert not re.search(r"""(src|href|url)\s*[=(:]\s*["']?(https?:)?//""", r.text), path
        assert not re.search(r"""fetch\(\s*["'`](https?:)?//""", r.text), path
    assert http.get(url + "/ui/static/server.py", headers={"Authorization": ""}).status_code == 404
    assert http.get(url + "/v1/history", headers={"Authorization": ""}).status_code == 401
    assert http.get(url + "/v1/history", headers={"Authorization": "Bearer wrong"}).status_code == 401
    docs = http.get(url + "/docs").text
    assert "/ui/static/swagger-ui-bundle.js" in docs and "cdn" not in docs.lower()
    bundle = http.get(url + "/ui/static/swagger-ui-bundle.js")
    assert bundle.status_code == 200 and "SwaggerUIBundle" in bundle.text
    assert http.get(url + "/redoc").status_code == 404  # FastAPI's redoc page loads a CDN script


def test_history_is_fed_by_the_runs_facts(run: Run) -> None:
    _training(run)
    history = run.read("/v1/history?since=0")
    evaluations, cycles = history["evaluations"], history["cycles"]
    assert evaluations and cycles and history["seq"] == max(p["seq"] for p in evaluations + cycles)
    assert {c["worker"] for c in cycles} == set(AGENTS)  # names, not ids
    assert [e["elapsed"] for e in evaluations] == sorted(e["elapsed"] for e in evaluations)
    assert all(0 <= e["accuracy"] <= 1 for e in evaluations)
    later = run.read(f"/v1/history?since={history['seq']}")
    assert all(p["seq"] > history["seq"] for p in later["evaluations"] + later["cycles"])


@needs_browser
def test_browser_without_token_shows_the_token_form(run: Run) -> None:
    page = load(run.server.url + "/ui", budget_ms=1500)
    assert page.body.get("loaded") == "0" and "token" in page.body.get("error", ""), page.body
    assert page.text.get("version") == "-"


@needs_browser
def test_browser_shows_the_run_while_it_goes(run: Run) -> None:
    before = _training(run)
    page = load(f"{run.server.url}/ui#token={JOIN_TOKEN}")
    after = run.read("/v1/status")
    assert int(page.body["loaded"]) >= 2, page.body  # it kept polling
    assert "error" not in page.body, page.body
    # Every worker /v1/workers lists (the fixture's probe, which left, too) and no other.
    assert set(page.rows) == {w["name"] for w in run.read("/v1/workers")} >= set(AGENTS)
    assert before["model_version"] <= int(page.text["version"]) <= after["model_version"]
    shown = {f"{e['accuracy']:.4f}" for e in run.read("/v1/history")["evaluations"]}
    assert page.text["metric"] in shown and page.text["metric-label"] == "test accuracy"
    assert page.text["task"] == f"task {after['task']}"
    assert page.text["preset"] == "hermes · hermes"
    assert page.text["outcome"] == "running"
    # The curves are drawn: accuracy and loss lines, one cycle-time line per worker with its legend.
    assert page.polylines.get("chart-accuracy") == 1 and page.polylines.get("chart-loss") == 1
    assert page.polylines.get("chart-cycles") == len(AGENTS)
    assert set(AGENTS) <= set(page.svg_text["chart-cycles"]) and set(AGENTS) <= set(page.svg_text["chart-gate"])


@needs_browser
def test_browser_matches_status_once_the_run_is_over(run: Run) -> None:
    _training(run)
    r = run.server.http.post(run.server.url + "/v1/stop", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert r.status_code == 200, r.text
    codes = [a.wait(timeout=60) for a in run.agents]
    assert codes == [0] * len(AGENTS)

    def settled() -> tuple[Page, dict[str, Any], list[dict[str, Any]]] | None:
        # A last evaluation may land after the stop: compare only when nothing moved while the page loaded.
        status, workers = _still(run.read("/v1/status")), run.read("/v1/workers")
        page = load(f"{run.server.url}/ui#token={ADMIN_TOKEN}", budget_ms=2500)
        same = _still(run.read("/v1/status")) == status and run.read("/v1/workers") == workers
        return (page, status, workers) if same else None

    page, status, workers = wait_for(settled, 60, "a page load during which the status did not change",
                                     interval=0.5)
    assert page.text["version"] == str(status["model_version"])
    assert page.text["metric"] == f"{status['evaluation']['accuracy']:.4f}"
    assert page.text["loss"] == f"{status['evaluation']['loss']:.4f}"
    assert page.text["evaluated-version"] == str(status["evaluation"]["version"])
    assert page.text["best"] == f"{status['best_accuracy']:.4f}"
    assert page.text["workers-active"] == str(status["workers_active"]) == "0"
    assert page.text["outcome"] == f"stopped: {status['stop_reason']}"
    for w in workers:
        if w["name"] not in AGENTS:
            continue  # the fixture's probe
        row = page.rows[w["name"]]
        assert row[STATE] == w["state"] == "left"
        assert (row[DSS], row[BATCH], row[CYCLES]) == (str(w["dss"]), str(w["batch_size"]), str(w["cycles"]))
        assert (row[PUSHED], row[SKIPPED], row[MESSAGES]) == (str(w["gate_pushes"]), str(w["gate_skips"]),
                                                              str(w["messages"]))
    shown = [w for w in workers if w["name"] in page.rows]
    assert page.text["gate-pushes"] == str(sum(w["gate_pushes"] for w in shown))
    assert page.text["messages"] == str(sum(w["messages"] for w in shown))


def test_tensorboard_files_hold_the_runs_scalars(run: Run) -> None:
    event_accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator", reason="tensorboard is not installed")
    _training(run)
    run.stop_server()  # the files are complete once the server has closed them
    summary = json.loads((run.server.out_dir / "server_summary.json").read_text())
    acc = event_accumulator.EventAccumulator(str(run.tensorboard))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    per_worker = ("cycle_seconds", "batch_size", "dss", "gate_pushes", "gate_skips")
    assert {"test/accuracy", "test/loss", "messages/total", "bytes/received", "bytes/sent"} <= tags
    assert {f"{kind}/{name}" for kind in per_worker for name in AGENTS} <= tags

    written = acc.Scalars("test/accuracy")  # every evaluation of the run, the shutdown's last one included
    assert [s.step for s in written] == [e["version"] for e in summary["evaluations"]]
    assert [s.value for s in written] == pytest.approx([e["accuracy"] for e in summary["evaluations"]], abs=1e-6)
    assert [s.value for s in acc.Scalars("test/loss")] == pytest.approx([e["loss"] for e in summary["evaluations"]],
                                                                         rel=1e-6)
    messages = [s.value for s in acc.Scalars("messages/total")]
    assert messages == sorted(messages) and messages[-1] == pytest.approx(summary["messages_total"], rel=1e-6)
    assert acc.Scalars("bytes/received")[-1].value == pytest.approx(summary["bytes_received_total"], rel=1e-6)
    for w in summary["workers"]:
        if w["name"] not in AGENTS:
            continue
        cycle_seconds = acc.Scalars(f"cycle_seconds/{w['name']}")
        assert [s.step for s in cycle_seconds] == list(range(1, w["cycles"] + 1))
        tail = w["cycle_log"]  # the registry's last cycles, oldest first: elapsed, dss, batch_size, compute_seconds, ...
        assert [s.value for s in acc.Scalars(f"dss/{w['name']}")][-len(tail):] == [c[1] for c in tail]
        assert [s.value for s in acc.Scalars(f"batch_size/{w['name']}")][-len(tail):] == [c[2] for c in tail]
        # The cycle log keeps seconds rounded to 1e-6 (registry), the event file float32 of the raw value.
        assert [s.value for s in cycle_seconds][-len(tail):] == pytest.approx([c[3] for c in tail], abs=1e-6)
        assert acc.Scalars(f"gate_pushes/{w['name']}")[-1].value == w["gate_pushes"]
        assert acc.Scalars(f"gate_skips/{w['name']}")[-1].value == w["gate_skips"]


def test_unwritable_tensorboard_dir_is_one_line_and_exit_2(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    r = subprocess.run([sys.executable, "-m", "hermes.server.cli", "--insecure", "--port", "0",
                        "--tensorboard", str(blocker / "tb")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        f"hermes-server: configuration error: --tensorboard {str(blocker / 'tb')!r}: cannot create it (Not a directory)"]


# ---- any task: its own metrics charted, its target drawn, the task named (issue 30) -----------------------------

FIXTURES = Path(__file__).resolve().parent / "task_fixtures.py"
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "img" / "ui-regression.png"
WINDOW = (1280, 1500)


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", "not a PNG"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


@needs_browser
def test_a_regression_task_shows_its_r2_chart_and_target(tmp_path: Path) -> None:
    """The tiny regression task (r2 and mse, no accuracy) with an r2 target, on preset asp (no gate)."""
    env = {**os.environ, "HERMES_JOIN_TOKEN": JOIN_TOKEN, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    with running_server(tmp_path / "srv", "--task", f"{FIXTURES}:regression", "--target", "r2=0.97") as srv:
        with open(tmp_path / "agent.log", "wb") as fh:
            agent = subprocess.Popen(
                [sys.executable, "-m", "hermes.client.cli", "--server", srv.url, "--name", "edge-r",
                 "--no-progress", "--task", f"{FIXTURES}:regression"], stdout=fh, stderr=subprocess.STDOUT, env=env)
        try:
            def evaluated() -> bool:
                # Three evaluations to chart, or fewer when the run reached its target first (none come after).
                n = len(srv.get_json("/v1/history")["evaluations"])
                return n >= 3 or (n >= 1 and srv.get_json("/v1/status")["outcome"] == "target_reached")

            wait_for(evaluated, 120, "three evaluations, or the target reached")
            page = load(f"{srv.url}/ui")
            status = srv.get_json("/v1/status")
            shown = {f"{e['metrics']['r2']:.4f}" for e in srv.get_json("/v1/history")["evaluations"]}
            with tempfile.TemporaryDirectory(prefix="hermes-chromium-") as profile:
                shot = tmp_path / "ui.png"
                r = subprocess.run(
                    [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--hide-scrollbars", f"--user-data-dir={profile}", "--virtual-time-budget=4000",
                     f"--window-size={WINDOW[0]},{WINDOW[1]}", f"--screenshot={shot}", f"{srv.url}/ui"],
                    capture_output=True, text=True, timeout=90)
            assert r.returncode == 0 and shot.is_file(), r.stderr[-2000:]
        finally:
            agent.kill()
            agent.wait(timeout=30)
    assert "error" not in page.body, page.body
    assert page.text["task"] == "task tiny-regression" == f"task {status['task']}"
    assert page.text["metric-label"] == "test r2" and page.text["metric"] in shown
    assert page.text["target"] == "r2 0.97"
    # One chart per metric the task reports, none for the accuracy it does not have.
    assert page.polylines.get("chart-r2") == 1 and page.polylines.get("chart-mse") == 1
    assert "chart-accuracy" not in page.polylines and "chart-accuracy" not in page.svg_text
    # The target is drawn on its metric's chart only.
    assert "target 0.97" in page.svg_text["chart-r2"]
    assert not any("target" in t for t in page.svg_text.get("chart-mse", []))
    assert _png_size(shot.read_bytes()) == WINDOW
    # The screenshot in the docs (docs/dashboard.md) is this page: refreshed with HERMES_UPDATE_SCREENSHOTS=1.
    if os.environ.get("HERMES_UPDATE_SCREENSHOTS") == "1":
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, SCREENSHOT)
    assert _png_size(SCREENSHOT.read_bytes()) == WINDOW
