"""Agent set-up mistakes, as users make them: each ends in one line and its exit code, quickly.

A real ``hermes-server`` (bound to 127.0.0.1, advertising 127.0.0.2: an
operator who forgot ``--advertise-host``) and ``python -m hermes.client.cli``
started as users start it. Mistakes found before the agent imports torch
end the process before torch is imported (torch takes 10 s and more to
import on a loaded 2-core machine); those that need a registration (the
advertised data plane, a name in use) end at the first refusal, without
retrying. How long each takes is measured by benchmarks/startup.py, not
asserted here: a wall-clock budget failed by chance on a loaded machine
(issue 32).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from hermes.deploy.procs import free_port, free_ports, start, wait_healthy
from tests.conftest import JOIN_TOKEN, parse_metric

pytestmark = pytest.mark.integration

# Only a hang fails on time (issue 32).
HANG_S = 120.0


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HERMES_")}
    return {**env, "HERMES_JOIN_TOKEN": JOIN_TOKEN, "PYTHONUNBUFFERED": "1", **extra}


@dataclass
class Result:
    rc: int
    stderr: str  # without the interpreter's import profile
    imported: frozenset[str]  # every module the process imported (PYTHONPROFILEIMPORTTIME)

    @property
    def message_lines(self) -> list[str]:
        """stderr without the log lines (those start with a date)."""
        return [ln for ln in self.stderr.splitlines() if ln.strip() and not ln[:4].isdigit()]

    def one_line(self) -> str:
        assert "Traceback" not in self.stderr, self.stderr
        lines = self.message_lines
        assert len(lines) == 1, self.stderr
        assert lines[0].startswith("hermes-client: "), lines
        return lines[0]



def agent(*args: str, env: dict[str, str] | None = None, timeout: float = HANG_S) -> Result:
    proc = subprocess.Popen([sys.executable, "-m", "hermes.client.cli", "--no-progress", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**(env or _env()), "PYTHONPROFILEIMPORTTIME": "1"})
    lines: list[str] = []
    imported: set[str] = set()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            if line.startswith("import time:"):  # "import time: self [us] | cumulative | name"
                imported.add(line.rsplit("|", 1)[-1].strip())
            else:
                lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        rc = proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(timeout=HANG_S)
    return Result(rc, "".join(lines), frozenset(imported))


@dataclass
class Server:
    url: str
    data_port: int


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server that advertises 127.0.0.2 for a data plane bound to 127.0.0.1 only."""
    out = tmp_path_factory.mktemp("setup-server")
    port, data_port = free_ports(2)
    log = out / "server.log"
    proc = start([sys.executable, "-m", "hermes.server.cli", "--host", "127.0.0.1", "--port", str(port),
                  "--data-host", "127.0.0.1", "--data-port", str(data_port), "--advertise-host", "127.0.0.2",
                  "--preset", "asp", "--set", "model=mlp", "--heartbeat-interval", "0.5", "--out", str(out)],
                 log_path=log, env=_env(), cwd=out)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url, timeout=90.0, log_path=log)
        yield Server(url, data_port)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_server_url_without_scheme() -> None:
    r = agent("--server", "10.0.0.5:8000")
    line = r.one_line()
    assert r.rc == 2 and "'http://10.0.0.5:8000'" in line and "torch" not in r.imported, (r.rc, line)
    r = agent("--server", "localhost:8000")
    assert r.rc == 2 and "'http://localhost:8000'" in r.one_line()


@pytest.mark.parametrize(("var", "value", "says"), [
    ("HERMES_THREADS", "abc", "not a valid int"),
    ("HERMES_SLOWDOWN", "fast", "not a valid float"),
    ("HERMES_NO_PROGRESS", "maybe", "expected 1/true/yes/on"),
    ("HERMES_LOG_LEVEL", "verbose", "choose from debug"),
])
def test_bad_environment_value_is_named(var: str, value: str, says: str) -> None:
    r = agent("--server", "http://127.0.0.1:1", env=_env(**{var: value}))
    line = r.one_line()
    assert r.rc == 2 and f"{var}={value!r}" in line and says in line and "torch" not in r.imported, line


def test_unknown_flag_suggests_the_closest() -> None:
    r = agent("--server", "http://127.0.0.1:1", "--slowdwn", "2")
    line = r.one_line()
    assert r.rc == 2 and "did you mean --slowdown?" in line, line
    # No prefix matching: an abbreviation is an unknown flag, not a silent --slowdown-schedule.
    assert agent("--server", "http://127.0.0.1:1", "--slowdown-sched", "1:2").rc == 2


def test_unreachable_server_bounded_retry_exit_3() -> None:
    port = free_port()  # nothing listens here
    r = agent("--server", f"http://127.0.0.1:{port}", "--connect-retries", "1")
    line = r.one_line()
    assert r.rc == 3 and f"127.0.0.1:{port} unreachable after 2 attempts" in line, line
    assert "retry 1/1" in r.stderr and "retry 2/" not in r.stderr and "torch" not in r.imported, r.stderr


def test_data_port_given_as_server(server: Server) -> None:
    r = agent("--server", f"http://127.0.0.1:{server.data_port}")
    line = r.one_line()
    assert r.rc == 2 and "this looks like the server's data port" in line and "--port" in line, line
    assert "torch" not in r.imported


def test_unreachable_advertised_data_plane_names_advertise_host(server: Server) -> None:
    r = agent("--server", server.url, "--name", "far-away")
    line = r.one_line()
    assert r.rc == 3 and f"tcp://127.0.0.2:{server.data_port}" in line and "--advertise-host" in line, line
    # Told by the refused connection, not after the probe's timeout.
    assert "(connection refused)" in line, line
    # It said goodbye: the server does not wait for it to go silent.
    workers = httpx.get(server.url + "/v1/workers", timeout=5).json()
    assert [w["state"] for w in workers if w["name"] == "far-away"] == ["left"]


def test_second_live_agent_with_the_same_name_is_refused(server: Server) -> None:
    # The first agent: registered and heartbeating (as a live agent does), at the HTTP boundary.
    reg = httpx.post(server.url + "/v1/workers/register", timeout=10,
                     headers={"Authorization": f"Bearer {JOIN_TOKEN}"},
                     json={"name": "twin", "hints": {"instance": "a1" * 8}}).json()
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(0.2):
            httpx.post(f"{server.url}/v1/workers/{reg['worker_id']}/heartbeat", json={}, timeout=5,
                       headers={"X-Hermes-Token": reg["token"]})

    def refusals() -> float:
        text = httpx.get(server.url + "/metrics", timeout=10).text
        return parse_metric(text, "hermes_registrations_total", outcome="name_in_use")

    before = refusals()
    beater = threading.Thread(target=beat, daemon=True)
    beater.start()
    try:
        r = agent("--server", server.url, "--name", "twin")
    finally:
        stop.set()
        beater.join(timeout=10)
    line = r.one_line()
    assert r.rc == 4 and "'twin'" in line and "in use by another live agent" in line and "--name" in line, line
    # It waited once for a holder that might be its own dead predecessor, then gave up: two refusals.
    assert r.stderr.count("in case it is a previous run of this agent that died") == 1, r.stderr
    assert refusals() - before == 2
    # The first agent keeps its registration.
    r2 = httpx.post(f"{server.url}/v1/workers/{reg['worker_id']}/heartbeat", json={}, timeout=5,
                    headers={"X-Hermes-Token": reg["token"]})
    assert r2.status_code == 200, r2.text


_NAME_PROBE = ("import sys; from hermes.client.preflight import default_name; "
               "print(default_name('edge', sys.argv[1]), flush=True); sys.stdin.read()")


def test_default_names_are_unique_per_host_and_reused(tmp_path: Path) -> None:
    procs = [subprocess.Popen([sys.executable, "-c", _NAME_PROBE, str(tmp_path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for _ in range(3)]
    try:
        names = [p.stdout.readline().strip() for p in procs]  # type: ignore[union-attr]
        assert sorted(names) == ["edge", "edge-2", "edge-3"]
        # The first one ends: a new agent on this host takes its name back (and its workload on the server).
        first = procs[names.index("edge")]
        first.communicate("", timeout=10)
        again = subprocess.run([sys.executable, "-c", _NAME_PROBE, str(tmp_path)], input="", capture_output=True,
                               text=True, timeout=30)
        assert again.stdout.strip() == "edge"
    finally:
        for p in procs:
            if p.poll() is None:
                p.communicate("", timeout=10)
