"""``hermes-deploy`` end to end against a real OpenSSH server on loopback.

The module starts Debian's ``/usr/sbin/sshd`` on a free 127.0.0.1 port with a
throwaway host key and user key (logging in as the current user), and a real
``hermes-server``. "Devices" are inventory hosts pointing at that sshd, each
with its own work directory. The roll-out then runs as a user runs it:
check, install (a wheel built from this checkout, into a venv with the system
site-packages so torch is not downloaded), start (a real agent joins the
server and trains), status, logs, stop; plus a wrong key, an unreachable
host, a host that never answers, and host-key verification with and without
trust on first use.

Skipped with the reason when sshd or ssh-keygen is missing
(``apt-get install openssh-server``; ``.ci/run`` does it when it can).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

paramiko = pytest.importorskip("paramiko", reason="paramiko is not installed (pip install -e '.[dev]')")

from hermes.deploy import rollout, rollout_install, ssh_cli
from hermes.deploy.inventory import load_inventory
from tests.conftest import JOIN_TOKEN, free_ports

pytestmark = pytest.mark.integration

SSHD = Path("/usr/sbin/sshd")
# Waits that only fail on a hang: how fast things happen is not asserted here (issue 32).
HANG_S = 120
SSH_KEYGEN = shutil.which("ssh-keygen")


@contextlib.contextmanager
def _sshd(root: Path) -> Iterator[dict[str, Any]]:
    if not SSHD.is_file():
        pytest.skip("no OpenSSH server: /usr/sbin/sshd is missing (apt-get install openssh-server)")
    if SSH_KEYGEN is None:
        pytest.skip("ssh-keygen is missing (apt-get install openssh-client)")
    root.mkdir(parents=True, exist_ok=True)
    for name in ("host_key", "user_key", "wrong_key", "other_host_key"):
        subprocess.run([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(root / name)],
                       check=True, timeout=30)
    (root / "authorized_keys").write_text((root / "user_key.pub").read_text())
    # sshd insists on its privilege-separation directory even when it cannot use it.
    try:
        Path("/run/sshd").mkdir(mode=0o755, parents=True, exist_ok=True)
    except OSError as exc:
        pytest.skip(f"sshd needs /run/sshd and it cannot be created: {exc}")
    (port,) = free_ports(1)
    config = root / "sshd_config"
    config.write_text(textwrap.dedent(f"""\
        Port {port}
        ListenAddress 127.0.0.1
        HostKey {root / 'host_key'}
        AuthorizedKeysFile {root / 'authorized_keys'}
        PubkeyAuthentication yes
        PasswordAuthentication no
        KbdInteractiveAuthentication no
        UsePAM no
        PermitRootLogin prohibit-password
        StrictModes no
        PidFile {root / 'sshd.pid'}
        Subsystem sftp internal-sftp
        LogLevel VERBOSE
    """))
    log = open(root / "sshd.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + HANG_S
        while True:
            if proc.poll() is not None:
                pytest.skip(f"sshd exited at start ({proc.returncode}): {(root / 'sshd.log').read_text()[-2000:]}")
            with socket.socket() as s:
                s.settimeout(0.5)
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if time.monotonic() > deadline:
                pytest.fail(f"sshd did not listen on {port}: {(root / 'sshd.log').read_text()[-2000:]}")
            time.sleep(0.05)
        host_pub = (root / "host_key.pub").read_text().split()
        known_hosts = root / "known_hosts"
        known_hosts.write_text(f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}\n")
        yield {"port": port, "root": root, "known_hosts": known_hosts, "user_key": root / "user_key",
               "wrong_key": root / "wrong_key", "host_pub": host_pub, "log": root / "sshd.log",
               "other_host_pub": (root / "other_host_key.pub").read_text().split()}
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        log.close()


@pytest.fixture(scope="module")
def sshd(tmp_path_factory) -> Iterator[dict[str, Any]]:
    with _sshd(tmp_path_factory.mktemp("sshd")) as info:
        yield info


def _silent_port() -> tuple[socket.socket, int]:
    """A port that accepts TCP connections and never says a word (a hung device)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    return s, s.getsockname()[1]


def write_inventory(path: Path, sshd: dict[str, Any], hosts: list[dict[str, Any]], *,
                    known_hosts: Path | None = None) -> Path:
    """A TOML inventory of hosts on the loopback sshd (fields per host override the defaults)."""
    def val(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return str(v)
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(val(x) for x in v) + "]"
        return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'

    lines = [f"known_hosts = {val(known_hosts or sshd['known_hosts'])}", "", "[defaults]",
             f"port = {sshd['port']}",
             f"key_file = {val(sshd['user_key'])}",
             f"python = {val(sys.executable)}",
             "system_site_packages = true",
             'deps = "present"',
             "connect_timeout = 5", ""]
    for h in hosts:
        lines.append("[[hosts]]")
        h = {"host": "127.0.0.1", **h}
        lines += [f"{k} = {val(v)}" for k, v in h.items() if k != "env"]
        if "env" in h:
            lines.append("env = { " + ", ".join(f"{k} = {val(v)}" for k, v in h["env"].items()) + " }")
        lines.append("")
    path.write_text("\n".join(lines))
    load_inventory(path)  # the helper must write valid inventories
    return path


def deploy(capsys, *argv: str) -> tuple[int, str, list[str]]:
    """Run ``hermes-deploy`` in-process; (exit code, table text, table rows)."""
    capsys.readouterr()
    rc = ssh_cli.main([str(a) for a in argv])
    out = capsys.readouterr().out
    return rc, out, out.splitlines()


def row(out: str, host: str) -> str:
    for line in out.splitlines():
        if line.split(" ", 1)[0] == host:
            return line
    raise AssertionError(f"no row for {host} in:\n{out}")


def _pid_alive(pid: int) -> bool:
    """Alive and not a zombie (a reaper-less PID 1 leaves zombies behind)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


# ---------------------------------------------------------------------------


def test_cli_script_check_and_failures_do_not_block(sshd, tmp_path) -> None:
    """The installed console script: a good host, a wrong key, a refused port and a silent one, in parallel."""
    silent, silent_port = _silent_port()
    try:
        inv = write_inventory(tmp_path / "edge.toml", sshd, [
            {"name": "good", "workdir": str(tmp_path / "good")},
            {"name": "wrong-key", "key_file": str(sshd["wrong_key"]), "workdir": str(tmp_path / "wk")},
            {"name": "refused", "port": free_ports(1)[0]},
            {"name": "silent", "port": silent_port, "connect_timeout": 3},
        ])
        # The script of the interpreter running the tests: another hermes-deploy earlier on PATH
        # may belong to another installation (seen: a stale editable install of a deleted checkout).
        beside = Path(sys.executable).parent / "hermes-deploy"
        script = str(beside) if beside.exists() else shutil.which("hermes-deploy")
        cmd = [script] if script else [sys.executable, "-m", "hermes.deploy.ssh_cli"]
        r = subprocess.run([*cmd, "check", "-i", str(inv)], capture_output=True, text=True, timeout=HANG_S)
    finally:
        silent.close()
    assert r.returncode == 1, (r.stdout, r.stderr)
    out = r.stdout
    assert "Python 3." in row(out, "good") and " ok " in row(out, "good"), out
    assert "cores" in row(out, "good") and "RAM" in row(out, "good") and "disk" in row(out, "good")
    assert "FAILED" in row(out, "wrong-key") and "auth" in row(out, "wrong-key"), out
    assert "FAILED" in row(out, "refused") and "unreachable" in row(out, "refused"), out
    assert "FAILED" in row(out, "silent"), out
    assert "1 ok, 3 failed" in out
    # The silent host costs at least its own connect timeout (3 s, the table's TIME column); how long
    # the whole check takes is not asserted (issue 32).
    assert float(row(out, "silent").split()[2].rstrip("s")) >= 3.0, out
    results = {}
    inventory = load_inventory(inv)
    results = {r.host: r for r in rollout.run_on_hosts(inventory.hosts[:3], rollout_install.check,
                                                       rollout.Options(known_hosts=inventory.known_hosts))}
    assert results["good"].ok and results["good"].details["python"] == ".".join(map(str, sys.version_info[:3]))
    assert results["wrong-key"].error_kind == "auth"
    # A refused port is told at once (connection refused), not after a connect timeout.
    assert results["refused"].error_kind == "unreachable", results["refused"]
    assert "no answer within" not in results["refused"].summary, results["refused"]


def test_per_host_deadline_never_blocks(sshd, tmp_path) -> None:
    """A host that hangs past --timeout is reported as timed out while the others finish."""
    silent, silent_port = _silent_port()
    try:
        inv = load_inventory(write_inventory(tmp_path / "edge.toml", sshd, [
            {"name": "good", "workdir": str(tmp_path / "good")},
            {"name": "hung", "port": silent_port, "connect_timeout": 60},
        ]))
        results = rollout.run_on_hosts(inv.hosts, rollout_install.check,
                                       rollout.Options(known_hosts=inv.known_hosts, timeout=2.0))
    finally:
        silent.close()
    good, hung = results
    assert good.ok, good
    assert not hung.ok and hung.error_kind == "timeout", hung
    # Cut by the per-host deadline (2 s), not by its own 60 s connect timeout ("no answer within 60s").
    assert hung.summary == "timeout: no result within 2s" and hung.seconds >= 2.0, hung


def test_host_key_verification_and_trust_on_first_use(sshd, tmp_path, capsys) -> None:
    kh = tmp_path / "ssh" / "known_hosts"
    inv = write_inventory(tmp_path / "edge.toml", sshd, [{"name": "dev", "workdir": str(tmp_path / "dev")}],
                          known_hosts=kh)
    rc, out, _ = deploy(capsys, "check", "-i", inv)
    assert rc == 1 and "unknown-host-key" in row(out, "dev"), out
    assert "SHA256:" in out and "--trust-on-first-use" in out
    assert not kh.exists(), "a refused key must not be recorded"

    rc, out, _ = deploy(capsys, "check", "-i", inv, "--trust-on-first-use")
    assert rc == 0, out
    recorded = kh.read_text().split()
    assert recorded == [f"[127.0.0.1]:{sshd['port']}", *sshd["host_pub"][:2]], recorded
    # Now known: accepted without the flag, and nothing appended twice.
    rc, out, _ = deploy(capsys, "check", "-i", inv, "--trust-on-first-use")
    assert rc == 0 and len(kh.read_text().splitlines()) == 1

    # A different recorded key: refused, with or without trust on first use.
    other = sshd["other_host_pub"]
    kh.write_text(f"[127.0.0.1]:{sshd['port']} {other[0]} {other[1]}\n")
    for extra in ([], ["--trust-on-first-use"]):
        rc, out, _ = deploy(capsys, "check", "-i", inv, *extra)
        assert rc == 1 and "host-key-mismatch" in row(out, "dev"), out
    assert kh.read_text().split()[2] == other[1], "a mismatching key must never be overwritten"


def test_start_without_install_is_refused(sshd, tmp_path, capsys) -> None:
    inv = write_inventory(tmp_path / "edge.toml", sshd, [{"name": "fresh", "workdir": str(tmp_path / "fresh")}])
    rc, out, _ = deploy(capsys, "start", "-i", inv, "--server", "http://127.0.0.1:9")
    assert rc == 1 and "hermes-deploy install" in row(out, "fresh"), out
    rc, out, _ = deploy(capsys, "status", "-i", inv)
    assert rc == 1 and "not-installed" in row(out, "fresh"), out
    # Unknown hermes-client flags are refused before any host is touched.
    rc, out, _ = deploy(capsys, "start", "-i", inv, "--server", "http://127.0.0.1:9", "--", "--no-such-flag")
    assert rc == 2 and out == ""


def test_roll_out_trains_on_the_device(sshd, server_factory, tmp_path, capsys, monkeypatch) -> None:
    """install -> start -> the agent joins the server and trains -> status -> logs -> stop."""
    server = server_factory("--preset", "asp")
    monkeypatch.setenv("HERMES_JOIN_TOKEN", JOIN_TOKEN)  # the server checks it
    wd = tmp_path / "device"
    inv = write_inventory(tmp_path / "edge.toml", sshd, [
        {"name": "edge-1", "workdir": str(wd / "edge-1"), "threads": 1, "device": "cpu",
         "client_args": ["--request-timeout", "20"], "env": {"OMP_NUM_THREADS": "1"},
         "forward_env": ["HERMES_JOIN_TOKEN"]},
        {"name": "edge-down", "port": free_ports(1)[0]},
    ])

    # No --wheel: hermes-deploy builds one from this checkout (a copy of it: the tree is not written to).
    assert rollout_install.find_source_tree() is not None, "the tests run from a checkout"
    rc, out, _ = deploy(capsys, "install", "-i", inv)
    assert rc == 1, out  # edge-down fails, edge-1 does not wait for it
    assert " ok " in row(out, "edge-1") and "installed hermes-edge 0.1.0" in row(out, "edge-1"), out
    assert "unreachable" in row(out, "edge-down")
    venv_python = wd / "edge-1" / "venv" / "bin" / "python"
    r = subprocess.run([str(venv_python), "-c", "import hermes.client.cli as m; print(m.__file__)"],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 0 and str(wd / "edge-1" / "venv") in r.stdout, (r.stdout, r.stderr)
    # deps = "present" with the system site-packages: torch must be there already. Where the
    # interpreter running the tests is itself a venv, its base has no torch: the device venv
    # sees the test venv's site-packages after its own (a .pth), as a system torch would be seen.
    if subprocess.run([str(venv_python), "-c", "import torch"], capture_output=True, timeout=120).returncode:
        import torch

        site = subprocess.run([str(venv_python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, timeout=60).stdout.strip()
        Path(site, "zz_test_system_torch.pth").write_text(str(Path(torch.__file__).parents[1]) + "\n")

    rc, out, _ = deploy(capsys, "start", "-i", inv, "--hosts", "edge-1", "--server", server.url, "--", "--slowdown", "1")
    assert rc == 0, out
    pid = int((wd / "edge-1" / "run" / "agent.pid").read_text())
    assert f"started pid {pid}" in row(out, "edge-1")
    try:
        # A second start refuses: one agent per device.
        rc, out, _ = deploy(capsys, "start", "-i", inv, "--hosts", "edge-1", "--server", server.url)
        assert rc == 1 and "already running" in row(out, "edge-1"), out

        # The forwarded secret is in the agent's environment, not on any command line.
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert f"HERMES_JOIN_TOKEN={JOIN_TOKEN}".encode() in environ
        assert b"s3cret" not in Path(f"/proc/{pid}/cmdline").read_bytes()

        deadline = time.monotonic() + HANG_S
        worker: dict[str, Any] = {}
        while time.monotonic() < deadline:
            worker = next((w for w in server.workers().values() if w.get("name") == "edge-1"), {})
            if worker.get("pushes", 0) > 0 and worker.get("samples", 0) > 0:
                break
            assert _pid_alive(pid), (wd / "edge-1" / "logs" / "agent.log").read_text()[-3000:]
            time.sleep(0.5)
        assert worker.get("pushes", 0) > 0, (worker, (wd / "edge-1" / "logs" / "agent.log").read_text()[-3000:])

        rc, out, _ = deploy(capsys, "status", "-i", inv, "--hosts", "edge-1")
        assert rc == 0 and f"running, pid {pid}" in row(out, "edge-1"), out

        dest = tmp_path / "fetched-logs"
        rc, out, _ = deploy(capsys, "logs", "-i", inv, "--dest", dest, "--tail", "3")
        assert rc == 1 and "unreachable" in row(out, "edge-down"), out
        text = (dest / "edge-1" / "agent.log").read_text()
        assert "registered as" in text and "(edge-1)" in text, text[-2000:]
        assert "==> edge-1:" in out

        rc, out, _ = deploy(capsys, "fetch", "-i", inv, "--hosts", "edge-1", "--dest", tmp_path / "fetched",
                            "--path", "logs", "--path", "run/agent.pid")
        assert rc == 0, out
        assert (tmp_path / "fetched" / "edge-1" / "logs" / "agent.log").is_file()
        assert (tmp_path / "fetched" / "edge-1" / "run" / "agent.pid").read_text().strip() == str(pid)

        rc, out, _ = deploy(capsys, "stop", "-i", inv, "--hosts", "edge-1", "--grace", "30")
        assert rc == 0 and f"stopped pid {pid} (SIGTERM)" in row(out, "edge-1"), out
        assert not _pid_alive(pid)
        assert not (wd / "edge-1" / "run" / "agent.pid").exists()
        # The agent left cleanly on SIGTERM: the server saw it go.
        deadline = time.monotonic() + HANG_S
        while time.monotonic() < deadline:
            worker = next((w for w in server.workers().values() if w.get("name") == "edge-1"), {})
            if worker.get("state") == "left":
                break
            time.sleep(0.2)
        assert worker.get("state") == "left", worker

        rc, out, _ = deploy(capsys, "status", "-i", inv, "--hosts", "edge-1")
        assert rc == 1 and "not running: stopped" in row(out, "edge-1"), out
        rc, out, _ = deploy(capsys, "stop", "-i", inv, "--hosts", "edge-1")
        assert rc == 0 and "nothing to stop" in row(out, "edge-1"), out

        # An agent whose run ends cleanly (--max-cycles) is FINISHED, not FAILED.
        rc, out, _ = deploy(capsys, "start", "-i", inv, "--hosts", "edge-1", "--server", server.url,
                            "--max-cycles", "2")
        assert rc == 0, out
        pid = int((wd / "edge-1" / "run" / "agent.pid").read_text())
        exit_file = wd / "edge-1" / "run" / "agent.exit"
        deadline = time.monotonic() + HANG_S
        while time.monotonic() < deadline and not (exit_file.is_file() and exit_file.read_text().strip()):
            time.sleep(0.5)
        assert exit_file.read_text().strip() == "0", (wd / "edge-1" / "logs" / "agent.log").read_text()[-3000:]
        rc, out, _ = deploy(capsys, "status", "-i", inv, "--hosts", "edge-1")
        assert rc == 0 and row(out, "edge-1").split()[1] == "FINISHED" and "exited 0" in row(out, "edge-1"), out
    finally:
        if _pid_alive(pid):
            os.killpg(os.getpgid(pid), signal.SIGKILL)
