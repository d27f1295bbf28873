"""The roll-out commands: each runs on many hosts at once and returns one result per host.

Layout on a device (``workdir``, default ``~/hermes-edge``)::

    wheels/hermes_edge-*.whl    the wheel last installed
    venv/                       the agent's virtual environment
    run/agent.pid               pid of the running agent (its own session)
    logs/agent.log              its output; the previous run's is agent.log.1

Every host runs in its own daemon thread with a deadline: a host that does not
answer is reported as failed when its time is up, and neither blocks the
others nor keeps the process alive (a ThreadPoolExecutor's workers are joined
at interpreter exit, which is why plain daemon threads are used).
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from hermes.deploy.inventory import TORCH_CPU_INDEX, Host
from hermes.deploy.remote import CommandResult, RemoteError, RemoteSession

log = logging.getLogger(__name__)

PID_FILE = "run/agent.pid"
LOG_FILE = "logs/agent.log"
# The agent's exit status, written by the shell that waits for it: a clean finish
# (its run ended, --max-cycles reached) tells itself apart from a crash.
EXIT_FILE = "run/agent.exit"
# hermes-client's exit codes (client/cli.py), as status reports them.
AGENT_EXIT_MEANINGS = {1: "error", 2: "configuration or usage error", 3: "server unreachable",
                       4: "refused by the server", 5: "collective group failed"}
DEFAULT_FETCH_PATHS = ("logs", "runs")
MIN_PYTHON = (3, 11)


class CommandFailed(Exception):
    """A command ran on the device and failed there; the message says why."""

    def __init__(self, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.details = details or {}


@dataclass
class HostResult:
    host: str
    ok: bool
    summary: str
    details: dict[str, Any] = field(default_factory=dict)
    error_kind: str | None = None
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"host": self.host, "ok": self.ok, "summary": self.summary, "error_kind": self.error_kind,
                "seconds": round(self.seconds, 3), "details": self.details}


@dataclass(frozen=True)
class Options:
    known_hosts: Path
    trust_on_first_use: bool = False
    timeout: float = 120.0  # per host, connect included
    parallel: int = 16


HostAction = Callable[[Host, RemoteSession], tuple[str, dict[str, Any]]]


# ---------------------------------------------------------------------------
# fan-out


def run_on_hosts(hosts: tuple[Host, ...] | list[Host], action: HostAction, options: Options) -> list[HostResult]:
    """Connect to every host and run ``action`` there, ``options.parallel`` at a time; results in host order."""
    results: dict[str, HostResult] = {}
    sessions: dict[str, RemoteSession] = {}
    started: dict[str, float] = {}
    lock = threading.Lock()
    gate = threading.Semaphore(max(1, options.parallel))

    def work(host: Host) -> None:
        with gate:
            t0 = time.monotonic()
            session = RemoteSession(host, known_hosts=options.known_hosts,
                                    trust_on_first_use=options.trust_on_first_use)
            with lock:
                if host.name in results:  # timed out while queued
                    return
                started[host.name] = t0
                sessions[host.name] = session
            result = _run_one(host, session, action)
            result.seconds = time.monotonic() - t0
            with lock:
                results.setdefault(host.name, result)

    threads = []
    for host in hosts:
        t = threading.Thread(target=work, args=(host,), name=f"deploy-{host.name}", daemon=True)
        t.start()
        threads.append(t)
    while True:
        with lock:
            now = time.monotonic()
            for host in hosts:
                t0 = started.get(host.name)
                if host.name not in results and t0 is not None and now - t0 > options.timeout:
                    log.warning("%s: no result after %.0fs, giving up on it", host.name, options.timeout)
                    results[host.name] = HostResult(host.name, False, f"timeout: no result within {options.timeout:g}s",
                                                    error_kind=RemoteError.TIMEOUT, seconds=now - t0)
                    sessions[host.name].abort()
            if len(results) == len(hosts):
                break
        time.sleep(0.05)
    return [results[h.name] for h in hosts]


def _run_one(host: Host, session: RemoteSession, action: HostAction) -> HostResult:
    try:
        with session:
            summary, details = action(host, session)
        return HostResult(host.name, True, summary, details)
    except RemoteError as exc:
        log.info("%s: %s", host.name, exc)
        return HostResult(host.name, False, str(exc), error_kind=exc.kind)
    except CommandFailed as exc:
        log.info("%s: %s", host.name, exc)
        return HostResult(host.name, False, str(exc), exc.details, error_kind="command")
    except Exception as exc:
        log.exception("%s: unexpected error", host.name)
        return HostResult(host.name, False, f"error: {type(exc).__name__}: {exc}", error_kind="error")


# ---------------------------------------------------------------------------
# shell helpers


def remote_path(workdir: str, *parts: str) -> str:
    """A path on the device: ``~/x`` and relative paths are relative to the login directory (home)."""
    if workdir == "~":
        workdir = "."
    elif workdir.startswith("~/"):
        workdir = workdir[2:] or "."
    return str(PurePosixPath(workdir, *parts))


def shown(path: str) -> str:
    """A remote path as a person reads it: relative ones are under the home directory."""
    return path if path.startswith("/") else "~/" + path.removeprefix("./")


def _q(value: str | os.PathLike[str]) -> str:
    return shlex.quote(str(value))


# Shell functions every script gets. alive PID: the process exists, is not a
# zombie and is a hermes-client (a recycled pid is not mistaken for ours).
_PRELUDE = r"""
alive() {
    [ -n "$1" ] || return 1
    kill -0 "$1" 2>/dev/null || return 1
    if [ -r "/proc/$1/stat" ]; then
        state=$(sed 's/.*) //' "/proc/$1/stat" | cut -c1)
        [ "$state" = Z ] && return 1
        tr '\0' ' ' < "/proc/$1/cmdline" 2>/dev/null | grep -q hermes-client || return 1
    fi
    return 0
}
# gone PID: no such process, or a zombie. ``alive`` turns false once an exiting process has
# no memory left (its cmdline reads empty); this waits for the exit to complete.
gone() {
    kill -0 "$1" 2>/dev/null || return 0
    [ "$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -c1)" = Z ]
}
# killtree PID: SIGKILL the agent and its process group (the shell waiting for it leads the group).
killtree() {
    pg=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f3)
    [ -n "$pg" ] && [ "$pg" != 0 ] && kill -KILL "-$pg" 2>/dev/null
    kill -KILL "$1" 2>/dev/null
}
"""


def _script(*lines: str) -> str:
    return _PRELUDE + "\n".join(lines) + "\n"


def _require_ok(res: CommandResult, what: str, details: dict[str, Any] | None = None) -> CommandResult:
    if res.rc != 0:
        raise CommandFailed(f"{what} failed (exit {res.rc}): {res.tail()}", details)
    return res


# ---------------------------------------------------------------------------
# check

_PROBE = r"""
import importlib.metadata as md, importlib.util, json, os, platform, shutil, socket, sys
wd = os.path.abspath(sys.argv[1])
probe = wd
while not os.path.exists(probe):
    probe = os.path.dirname(probe)
du = shutil.disk_usage(probe)
mem = {}
try:
    with open("/proc/meminfo") as fh:
        for line in fh:
            k, v = line.split(":", 1)
            mem[k] = int(v.split()[0]) * 1024
except OSError:
    pass
def version(name):
    try:
        return md.version(name) if importlib.util.find_spec(name) else None
    except Exception:
        return None
venv_py = os.path.join(wd, "venv", "bin", "python")
print(json.dumps({
    "hostname": socket.gethostname(), "system": platform.system(), "machine": platform.machine(),
    "python": platform.python_version(), "python_path": sys.executable,
    "cores": os.cpu_count(), "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
    "mem_total": mem.get("MemTotal"), "mem_available": mem.get("MemAvailable"),
    "disk_free": du.free, "disk_path": probe, "workdir": wd,
    "torch": version("torch"), "venv": os.path.exists(venv_py),
}))
"""


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**30:.1f} GiB"


def check(host: Host, s: RemoteSession) -> tuple[str, dict[str, Any]]:
    """Python version, cores, memory and free disk of the device."""
    wd = remote_path(host.workdir)
    res = s.run(_script(
        f"PY={_q(host.python)}",
        'command -v "$PY" >/dev/null 2>&1 || { echo "python $PY not found on the device" >&2; exit 20; }',
        f'exec "$PY" -c {_q(_PROBE)} {_q(wd)}',
    ), timeout=60)
    _require_ok(res, f"probe with {host.python}")
    info = json.loads(res.stdout.strip().splitlines()[-1])
    too_old = tuple(int(x) for x in info["python"].split(".")[:2]) < MIN_PYTHON
    summary = (f"Python {info['python']}{' (too old: needs >= 3.11)' if too_old else ''}, "
               f"{info['usable_cores']}/{info['cores']} cores, "
               f"RAM {_gib(info['mem_total'])} ({_gib(info['mem_available'])} free), "
               f"disk {_gib(info['disk_free'])} free, torch {info['torch'] or 'missing'}, "
               f"{'installed' if info['venv'] else 'not installed'}")
    if too_old:
        raise CommandFailed(summary, info)
    return summary, info


# ---------------------------------------------------------------------------
# install


def find_source_tree() -> Path | None:
    """The project checkout this package runs from (an editable install), if any."""
    root = Path(__file__).resolve().parent.parent
    meta = root / "pyproject.toml"
    try:
        if tomllib.loads(meta.read_text())["project"]["name"] == "hermes-edge":
            return root
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        pass
    return None


def build_wheel(source: Path, out_dir: Path, *, timeout: float = 300.0) -> Path:
    """Build the hermes-edge wheel from a checkout, from a copy of its sources (the tree is not written to)."""
    meta = tomllib.loads((source / "pyproject.toml").read_text())
    folders = set(meta.get("tool", {}).get("setuptools", {}).get("package-dir", {}).values())
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="hermes-wheel-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        for name in ("pyproject.toml", "setup.cfg", "setup.py", "MANIFEST.in", "README.md", "LICENSE", "LICENSE.txt"):
            if (source / name).is_file():
                shutil.copy2(source / name, src / name)
        junk = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "dist")
        for folder in sorted(folders):
            # A subpackage mapped on its own lies inside its parent's folder, copied already.
            if any(folder != f and Path(folder).is_relative_to(f) for f in folders):
                continue
            shutil.copytree(source / folder, src / folder, ignore=junk)
        dist = Path(tmp) / "dist"
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
               "--disable-pip-version-check", "--wheel-dir", str(dist), str(src)]
        log.info("building the wheel: %s", " ".join(cmd))
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=tmp)
        if r.returncode != 0:
            raise RuntimeError(f"wheel build failed (exit {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        wheels = sorted(dist.glob("hermes_edge-*.whl"))
        if len(wheels) != 1:
            raise RuntimeError(f"wheel build produced {[p.name for p in dist.iterdir()]}")
        target = out_dir / wheels[0].name
        shutil.copy2(wheels[0], target)
    log.info("built %s", target)
    return target


@dataclass(frozen=True)
class InstallOptions:
    wheel: Path
    deps: str | None = None  # None: each host's inventory value
    system_site_packages: bool | None = None
    recreate_venv: bool = False


_INDEX_OPTIONS = ("--index-url", "-i", "--no-index")


def torch_command(host: Host, pip: list[str]) -> list[str] | None:
    """The pip command that installs the host's torch before the wheel, or None (pip resolves it).

    Installed first, the CPU build satisfies the wheel's ``torch>=`` and pip
    never fetches the CUDA one. A host whose pip_args name their own index
    (an offline wheelhouse, a mirror) gets ``torch`` from there.
    """
    if host.torch in ("cuda", "pypi"):
        return None
    spec = "torch" if host.torch == "cpu" else host.torch
    own_index = any(a.split("=", 1)[0] in _INDEX_OPTIONS for a in host.pip_args)
    index = ["--index-url", TORCH_CPU_INDEX] if host.torch == "cpu" and not own_index else []
    return pip + index + [_q(spec)]


def install(host: Host, s: RemoteSession, opts: InstallOptions) -> tuple[str, dict[str, Any]]:
    """Upload the wheel and install it into ``workdir/venv``."""
    deps = opts.deps or host.deps
    site = host.system_site_packages if opts.system_site_packages is None else opts.system_site_packages
    wd = remote_path(host.workdir)
    prep = s.run(_script(
        f"PY={_q(host.python)}",
        'command -v "$PY" >/dev/null 2>&1 || { echo "python $PY not found on the device" >&2; exit 20; }',
        f'"$PY" -c "import sys; sys.exit(0 if sys.version_info >= {MIN_PYTHON!r} else 1)" '
        '|| { echo "$("$PY" -V 2>&1) is too old: hermes-edge needs Python >= 3.11" >&2; exit 21; }',
        f"mkdir -p {_q(wd)}/wheels {_q(wd)}/logs {_q(wd)}/run",
        f"rm -f {_q(wd)}/wheels/*.whl",
    ), timeout=60)
    _require_ok(prep, "preparing " + wd)
    remote_wheel = remote_path(wd, "wheels", opts.wheel.name)
    size = s.put(opts.wheel, remote_wheel)

    venv = remote_path(wd, "venv")
    flag = "true" if site else "false"
    pip = [f"{_q(venv)}/bin/python", "-m", "pip", "install", "--disable-pip-version-check", "--no-input"]
    pip += [_q(a) for a in host.pip_args]
    spec = opts.wheel.name if not host.extras else f"{opts.wheel.name}[{','.join(host.extras)}]"
    if deps == "present":
        # Dependencies are on the device already (e.g. a preinstalled torch seen
        # through --system-site-packages): install only our wheel, offline.
        steps = [" ".join(pip + ["--no-deps", "--no-index", "--force-reinstall", _q(remote_wheel)])]
    else:
        torch = torch_command(host, pip)
        steps = [" ".join(torch)] if torch else []
        steps += [" ".join(pip + [_q(remote_path(wd, "wheels", spec))]),
                 " ".join(pip + ["--no-deps", "--force-reinstall", _q(remote_wheel)])]
    res = s.run(_script(
        "set -e",
        f"PY={_q(host.python)}",
        f"VENV={_q(venv)}",
        f"WANT_SITE={flag}",
        # Recreate the venv when asked, or when its system-site-packages setting differs.
        'HAVE_SITE=$(sed -n "s/^include-system-site-packages *= *//p" "$VENV/pyvenv.cfg" 2>/dev/null || true)',
        f'if [ {"1" if opts.recreate_venv else "0"} = 1 ] || [ ! -x "$VENV/bin/python" ] || [ "$HAVE_SITE" != "$WANT_SITE" ]; then',
        '  rm -rf "$VENV"',
        '  if [ "$WANT_SITE" = true ]; then "$PY" -m venv --system-site-packages "$VENV"; else "$PY" -m venv "$VENV"; fi',
        "  echo venv=created",
        "fi",
        *steps,
        '"$VENV/bin/hermes-client" --help > /dev/null',
        'echo version=$("$VENV/bin/python" -c "import importlib.metadata as m; print(m.version(\'hermes-edge\'))")',
        'echo torch=$("$VENV/bin/python" -c "import torch; print(torch.__version__)" 2>/dev/null || echo missing)',
    ), timeout=3600)  # the per-host deadline (--timeout) ends it sooner
    details = {"wheel": opts.wheel.name, "bytes": size, "deps": deps, "system_site_packages": site, "venv": venv,
               "torch_build": host.torch if deps == "full" else "present"}
    _require_ok(res, "pip install", details)
    f = res.fields()
    details.update(version=f.get("version"), torch=f.get("torch"), venv_created=f.get("venv") == "created")
    return (f"installed hermes-edge {f.get('version')} ({size / 1e3:.0f} kB wheel, deps {deps}) in {shown(venv)}"
            f"{' (new venv)' if details['venv_created'] else ''}; torch {f.get('torch')}"), details


# ---------------------------------------------------------------------------
# start / status / stop


@dataclass(frozen=True)
class StartOptions:
    server: str | None = None
    client_args: tuple[str, ...] = ()
    max_cycles: int | None = None
    restart: bool = False
    startup_check: float = 2.0  # seconds the agent must survive to count as started


def agent_argv(host: Host, opts: StartOptions) -> list[str]:
    server = opts.server or host.server
    if not server:
        raise CommandFailed("no server URL: pass --server or set 'server' in the inventory")
    # Run from the work directory (start cd's there), so the path is relative to it.
    argv = ["venv/bin/hermes-client", "--server", server, "--name", host.name,
            "--no-progress"]
    if host.threads:
        argv += ["--threads", str(host.threads)]
    if host.device:
        argv += ["--device", host.device]
    argv += list(host.client_args) + list(opts.client_args)
    if opts.max_cycles is not None:
        argv += ["--max-cycles", str(opts.max_cycles)]
    return argv


def start(host: Host, s: RemoteSession, opts: StartOptions) -> tuple[str, dict[str, Any]]:
    """Run ``hermes-client`` detached (own session, nohup), with a pid file and a log file."""
    argv = agent_argv(host, opts)
    env = list(host.env)
    for name in host.forward_env:
        value = os.environ.get(name)
        if value is None:
            raise CommandFailed(f"forward_env: {name} is not set in hermes-deploy's environment")
        env.append((name, value))
    wd = remote_path(host.workdir)
    exports = [f"export {k}={_q(v)}" for k, v in env]
    res = s.run(_script(
        f"cd {_q(wd)} 2>/dev/null || {{ echo {_q(f'nothing installed in {shown(wd)}: run hermes-deploy install')} >&2; exit 21; }}",
        '[ -x venv/bin/hermes-client ] || { echo "hermes-client is not installed in the venv: run hermes-deploy install" >&2; exit 21; }',
        "mkdir -p run logs",
        f"if [ -f {PID_FILE} ]; then",
        f"  old=$(cat {PID_FILE})",
        '  if alive "$old"; then',
        f'    if [ {"1" if opts.restart else "0"} = 1 ]; then',
        '      kill -TERM "$old"; i=0',
        '      while alive "$old" && [ $i -lt 200 ]; do sleep 0.1; i=$((i+1)); done',
        '      alive "$old" && { killtree "$old"; sleep 0.5; }',
        "      echo restarted=$old",
        "    else",
        '      echo "already running (pid $old): use stop, or start --restart" >&2; exit 22',
        "    fi",
        "  fi",
        f"  rm -f {PID_FILE}",
        "fi",
        f"[ -f {LOG_FILE} ] && mv -f {LOG_FILE} {LOG_FILE}.1",
        f"rm -f {EXIT_FILE}",
        *exports,
        # setsid: a session of its own (no SIGHUP when the SSH connection goes). The
        # inner sh starts the agent, writes the agent's pid, and waits to record its exit status.
        f"nohup setsid sh -c '\"$@\" & echo $! > {PID_FILE}; wait $!; echo $? > {EXIT_FILE}' hermes-agent "
        f"{' '.join(_q(a) for a in argv)} > {LOG_FILE} 2>&1 < /dev/null &",
        "i=0",
        f'while [ ! -s {PID_FILE} ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done',
        f"pid=$(cat {PID_FILE} 2>/dev/null)",
        f"sleep {opts.startup_check:g}",
        'if alive "$pid"; then echo pid=$pid; exit 0; fi',
        # Finished already (e.g. --max-cycles 1 against a fast server): not a failed start.
        f'i=0; while [ ! -s {EXIT_FILE} ] && [ $i -lt 20 ]; do sleep 0.1; i=$((i+1)); done',
        f'if [ "$(cat {EXIT_FILE} 2>/dev/null)" = 0 ]; then echo pid=$pid; echo finished=1; exit 0; fi',
        f"rm -f {PID_FILE}",
        f"echo {_q(f'the agent exited at once; last lines of {shown(remote_path(wd, LOG_FILE))}:')} >&2",
        f"tail -n 15 {LOG_FILE} >&2",
        "exit 23",
    ), timeout=60)
    details: dict[str, Any] = {"argv": argv, "log": shown(remote_path(wd, LOG_FILE)), "env": [k for k, _ in env]}
    _require_ok(res, "start", details)
    pid = int(res.fields()["pid"])
    details["pid"] = pid
    if res.fields().get("finished"):
        return f"started pid {pid} -> {argv[2]}, which already finished cleanly (log {details['log']})", details
    return f"started pid {pid} -> {argv[2]} (log {details['log']})", details


def status(host: Host, s: RemoteSession) -> tuple[str, dict[str, Any]]:
    """Whether the agent runs; ok only when it does."""
    wd = remote_path(host.workdir)
    res = s.run(_script(
        f"cd {_q(wd)} 2>/dev/null || {{ echo state=not-installed; exit 0; }}",
        f"[ -f {PID_FILE} ] || {{ if [ -f {LOG_FILE} ]; then echo state=stopped; else echo state=never-started; fi; "
        f"tail -n 1 {LOG_FILE} 2>/dev/null | sed 's/^/last=/'; exit 0; }}",
        f"pid=$(cat {PID_FILE})",
        "echo pid=$pid",
        f'echo since=$(( $(date +%s) - $(stat -c %Y {PID_FILE} 2>/dev/null || date +%s) ))',
        'if alive "$pid"; then echo state=running; else echo state=exited; fi',
        f"[ -s {EXIT_FILE} ] && echo exit=$(cat {EXIT_FILE})",
        f"tail -n 1 {LOG_FILE} 2>/dev/null | sed 's/^/last=/'",
        "exit 0",
    ), timeout=30)
    _require_ok(res, "status")
    f = res.fields()
    state = f.get("state", "unknown")
    code = int(f["exit"]) if f.get("exit", "").isdigit() else None
    if state == "exited" and code == 0:
        state = "finished"
    details = {"state": state, "pid": int(f["pid"]) if f.get("pid", "").isdigit() else None,
               "seconds": int(f["since"]) if f.get("since", "").isdigit() else None, "last_log_line": f.get("last"),
               "exit_code": code}
    last = f" (last log line: {details['last_log_line']})" if details["last_log_line"] else ""
    if state == "running":
        return f"running, pid {details['pid']}, up {details['seconds']}s", details
    if state == "finished":
        details["result"] = "finished"
        return f"finished: the agent exited 0{last}", details
    if state == "exited" and code is not None:
        meaning = (f"killed by signal {code - 128}" if code > 128 else AGENT_EXIT_MEANINGS.get(code, "error"))
        raise CommandFailed(f"not running: exited with code {code} ({meaning}){last}", details)
    raise CommandFailed(f"not running: {state}{last}", details)


def stop(host: Host, s: RemoteSession, *, grace: float = 20.0) -> tuple[str, dict[str, Any]]:
    """SIGTERM (the agent leaves the run), then SIGKILL to its process group after ``grace`` seconds."""
    wd = remote_path(host.workdir)
    ticks = max(1, int(grace * 10))
    res = s.run(_script(
        f"cd {_q(wd)} 2>/dev/null || {{ echo state=not-installed; exit 0; }}",
        f"[ -f {PID_FILE} ] || {{ echo state=not-running; exit 0; }}",
        f"pid=$(cat {PID_FILE})",
        "echo pid=$pid",
        f'if ! alive "$pid"; then rm -f {PID_FILE}; echo state=already-exited; exit 0; fi',
        'kill -TERM "$pid"',
        "i=0",
        f'while alive "$pid" && [ $i -lt {ticks} ]; do sleep 0.1; i=$((i+1)); done',
        'if alive "$pid"; then killtree "$pid"; sleep 0.5; echo signal=KILL; '
        "else echo signal=TERM; fi",
        'if alive "$pid"; then echo "pid $pid survived SIGKILL" >&2; exit 24; fi',
        'j=0; while ! gone "$pid" && [ $j -lt 50 ]; do sleep 0.1; j=$((j+1)); done',
        f"rm -f {PID_FILE}",
        "echo state=stopped",
        "echo waited=$i",
    ), timeout=grace + 30)
    _require_ok(res, "stop")
    f = res.fields()
    details = {"state": f.get("state"), "pid": int(f["pid"]) if f.get("pid", "").isdigit() else None,
               "signal": f.get("signal")}
    if details["state"] == "stopped":
        return f"stopped pid {details['pid']} ({'SIGTERM' if details['signal'] == 'TERM' else 'SIGKILL after ' + format(grace, 'g') + 's'})", details
    return f"nothing to stop ({details['state']})", details


# ---------------------------------------------------------------------------
# logs / fetch


def logs(host: Host, s: RemoteSession, *, dest: Path, previous: bool = False) -> tuple[str, dict[str, Any]]:
    """Download ``logs/agent.log`` (and the previous run's with ``previous``) into ``dest/HOST/``."""
    wd = remote_path(host.workdir)
    got: dict[str, int] = {}
    names = ["agent.log"] + (["agent.log.1"] if previous else [])
    for name in names:
        remote = remote_path(wd, "logs", name)
        if s.kind_of(remote) != "file":
            continue
        got[name] = s.get(remote, dest / host.name / name)
    if "agent.log" not in got:
        raise CommandFailed(f"no log at {shown(remote_path(wd, LOG_FILE))}: has the agent been started?")
    local = dest / host.name / "agent.log"
    lines = local.read_text(errors="replace").splitlines()
    details = {"files": {n: str(dest / host.name / n) for n in got}, "bytes": got, "last_log_line": lines[-1] if lines else ""}
    return f"{local} ({got['agent.log']} bytes, {len(lines)} lines)", details


def fetch(host: Host, s: RemoteSession, *, dest: Path, paths: tuple[str, ...] = DEFAULT_FETCH_PATHS) -> tuple[str, dict[str, Any]]:
    """Download files or directories (relative to workdir, or absolute) into ``dest/HOST/``."""
    wd = remote_path(host.workdir)
    files: list[tuple[str, int]] = []
    missing: list[str] = []
    for p in paths:
        remote = p if p.startswith("/") else remote_path(wd, p)
        rel = PurePosixPath(p.lstrip("/"))
        if ".." in rel.parts:
            raise CommandFailed(f"fetch path {p!r}: '..' is not allowed")
        target = dest / host.name / Path(*rel.parts)
        kind = s.kind_of(remote)
        if kind == "dir":
            files += [(str(rel / f), n) for f, n in s.get_tree(remote, target)]
        elif kind == "file":
            files.append((str(rel), s.get(remote, target)))
        else:
            missing.append(remote)
    if not files:
        raise CommandFailed(f"nothing to fetch at {', '.join(missing) or ', '.join(paths)}")
    total = sum(n for _, n in files)
    details = {"dest": str(dest / host.name), "files": dict(files), "missing": missing}
    return f"{len(files)} file(s), {total} bytes -> {dest / host.name}", details
