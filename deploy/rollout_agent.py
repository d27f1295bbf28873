"""The agent on a device: ``start``, ``status`` and ``stop`` it; download its ``logs`` and files (``fetch``).

``start`` runs ``workdir/venv/bin/hermes-client`` (installed by ``rollout_install``)
with a pid file, an exit-status file and a log file under ``workdir``; the
others read those files (see the layout in ``hermes.deploy.rollout``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from hermes.deploy.inventory import Host
from hermes.deploy.remote import RemoteSession
from hermes.deploy.rollout import CommandFailed, quote, remote_path, require_ok, script, shown

PID_FILE = "run/agent.pid"
LOG_FILE = "logs/agent.log"
# The agent's exit status, written by the shell that waits for it: a clean finish
# (its run ended, --max-cycles reached) tells itself apart from a crash.
EXIT_FILE = "run/agent.exit"
# hermes-client's exit codes (client/cli.py), as status reports them.
AGENT_EXIT_MEANINGS = {1: "error", 2: "configuration or usage error", 3: "server unreachable",
                       4: "refused by the server", 5: "collective group failed"}
DEFAULT_FETCH_PATHS = ("logs", "runs")


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
    exports = [f"export {k}={quote(v)}" for k, v in env]
    res = s.run(script(
        f"cd {quote(wd)} 2>/dev/null || {{ echo {quote(f'nothing installed in {shown(wd)}: run hermes-deploy install')} >&2; exit 21; }}",
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
        f"{' '.join(quote(a) for a in argv)} > {LOG_FILE} 2>&1 < /dev/null &",
        "i=0",
        f'while [ ! -s {PID_FILE} ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done',
        f"pid=$(cat {PID_FILE} 2>/dev/null)",
        f"sleep {opts.startup_check:g}",
        'if alive "$pid"; then echo pid=$pid; exit 0; fi',
        # Finished already (e.g. --max-cycles 1 against a fast server): not a failed start.
        f'i=0; while [ ! -s {EXIT_FILE} ] && [ $i -lt 20 ]; do sleep 0.1; i=$((i+1)); done',
        f'if [ "$(cat {EXIT_FILE} 2>/dev/null)" = 0 ]; then echo pid=$pid; echo finished=1; exit 0; fi',
        f"rm -f {PID_FILE}",
        f"echo {quote(f'the agent exited at once; last lines of {shown(remote_path(wd, LOG_FILE))}:')} >&2",
        f"tail -n 15 {LOG_FILE} >&2",
        "exit 23",
    ), timeout=60)
    details: dict[str, Any] = {"argv": argv, "log": shown(remote_path(wd, LOG_FILE)), "env": [k for k, _ in env]}
    require_ok(res, "start", details)
    pid = int(res.fields()["pid"])
    details["pid"] = pid
    if res.fields().get("finished"):
        return f"started pid {pid} -> {argv[2]}, which already finished cleanly (log {details['log']})", details
    return f"started pid {pid} -> {argv[2]} (log {details['log']})", details


def status(host: Host, s: RemoteSession) -> tuple[str, dict[str, Any]]:
    """Whether the agent runs; ok only when it does."""
    wd = remote_path(host.workdir)
    res = s.run(script(
        f"cd {quote(wd)} 2>/dev/null || {{ echo state=not-installed; exit 0; }}",
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
    require_ok(res, "status")
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
    res = s.run(script(
        f"cd {quote(wd)} 2>/dev/null || {{ echo state=not-installed; exit 0; }}",
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
    require_ok(res, "stop")
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
