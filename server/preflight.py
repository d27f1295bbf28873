"""``hermes-server``'s start-up checks: one line for each mistake, before anything is written.

- Usage errors (an unknown flag, ``--port abc``) are one line, not argparse's
  usage block (``UsageParser``).
- Every flag has one environment twin, ``HERMES_<SETTING>``, read by the
  same pydantic-settings model; the parser is a ``HermesParser`` that only
  names it in ``--help`` (``add_env_twins``);
  a bad value is reported under the name the user wrote (``explain``):
  ``HERMES_PORT='abc': ...`` or ``--heartbeat-timeout: ...``.
- The control port is bound here and handed to uvicorn, the data and
  collective ports are tried (``claim_ports``): a port in use is one line
  naming the port and the flag that changes it, and nothing of the run
  (OUT, admin token, checkpoint) has been written yet.

Nothing here imports torch: these checks answer in about a second.
"""

from __future__ import annotations

import argparse
import errno
import socket
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any, NoReturn

from hermes.common.cli_env import ENV_NESTED, ENV_PREFIX, HermesParser

if TYPE_CHECKING:
    from pydantic import ValidationError

# Flags whose setting is not named like their dest.
_TWINS = {
    "set": f"{ENV_PREFIX}RUN (JSON object)",
    "resume": f"{ENV_PREFIX}RESUME=1 with {ENV_PREFIX}CHECKPOINT_DIR",
    "screening": f"{ENV_PREFIX}SCREENING{ENV_NESTED}ENABLED",
    "screening_norm_factor": f"{ENV_PREFIX}SCREENING{ENV_NESTED}NORM_FACTOR",
    "quarantine_after": f"{ENV_PREFIX}SCREENING{ENV_NESTED}QUARANTINE_AFTER",
}
# Settings set by a flag of another name (for messages that name what the user typed).
_FLAG_OF_FIELD = {"run": "--set", "resume": "--resume", "checkpoint_dir": "--checkpoint-dir/--resume"}


class PreflightError(Exception):
    """A start-up mistake found before anything was written (a port in use)."""


class UsageParser(HermesParser):
    """``hermes-server``'s parser: twins named in ``--help`` but read by ``ServerSettings``, and a one-line error.

    Unlike the other tools it keeps argparse's prefix matching (``--por 9000``) and its own error wording,
    as hermes-server always had them.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", True)
        super().__init__(*args, reads_env=False, **kwargs)

    def names_twin(self, help_text: str, name: str) -> bool:
        # A help naming any twin keeps it alone: --admin-token-file shows [HERMES_ADMIN_TOKEN], the token itself.
        return ENV_PREFIX in help_text

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def version_text(prog: str) -> str:
    try:
        return f"{prog} {version('hermes-edge')}"
    except PackageNotFoundError:  # a checkout on sys.path, not installed
        return f"{prog} 0+unknown"


def env_twin(dest: str) -> str | None:
    """The environment variable a flag's setting is read from when the flag is absent."""
    try:
        from hermes.server.settings import ServerSettings
    except ImportError:  # no server extra: main() says so
        return None
    if dest in _TWINS:
        return _TWINS[dest]
    if dest in ServerSettings.model_fields:
        return ENV_PREFIX + dest.upper()
    return None


def add_env_twins(parser: HermesParser) -> None:
    """Name each flag's twin after the setting it fills (``--out``: ``HERMES_OUT_DIR``) and show it in its help."""
    parser.env_names = {a.dest: env_twin(a.dest) for a in parser._actions if a.option_strings}
    parser.annotate_twins()


def operator_fields(args: argparse.Namespace) -> dict[str, Any]:
    """Settings of the flags the console and the start-up own (the run's own flags are in cli.main)."""
    names = ("host", "port", "overwrite", "access_log", "progress_interval_seconds", "log_level",
             "ssl_certfile", "ssl_keyfile", "ssl_ca_certfile")
    return {name: getattr(args, name, None) for name in names}


def explain(exc: ValidationError, given: dict[str, Any], parser: argparse.ArgumentParser) -> str:
    """A settings error in one line, naming the flag or the environment variable it came from."""
    flags = {a.dest: a.option_strings[0] for a in parser._actions if a.option_strings}
    parts = []
    for err in exc.errors():
        loc = [str(x) for x in err.get("loc", ())]
        msg = str(err.get("msg", "")).removeprefix("Value error, ")
        if not loc:  # a rule between settings
            parts.append(msg)
            continue
        field = loc[0]
        if field in given:
            where = _FLAG_OF_FIELD.get(field) or flags.get(field) or field
        else:
            where = f"{ENV_PREFIX}{ENV_NESTED.join(loc).upper()}={err.get('input')!r}"
        parts.append(f"{where}: {msg}")
    return "; ".join(parts)


def _loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def reachability_warning(settings: Any) -> str | None:
    """A data plane bound to loopback but advertised elsewhere: remote agents would register, then hang."""
    if _loopback(settings.data_host) and not _loopback(settings.advertise_host):
        return (f"the data plane binds {settings.data_host} (from --host) but agents are told to reach it at "
                f"{settings.advertise_host}: agents on other machines cannot; pass --data-host 0.0.0.0 (or that "
                "machine's address)")
    return None


def _bind(host: str, port: int, *, listen: bool = True) -> socket.socket:
    """A listening TCP socket on host:port, with SO_REUSEADDR as uvicorn and ZeroMQ set it (``listen``
    False: bound only, which still fails where another socket listens, and accepts no connection)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        if listen:
            sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock


def _why(exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return "is in use (another hermes-server, or an earlier one still running?)"
    if exc.errno == errno.EADDRNOTAVAIL:
        return "cannot be bound: the address is not one of this machine's"
    if exc.errno == errno.EACCES:
        return "needs privileges (ports below 1024)"
    return f"cannot be bound ({exc.strerror or exc})"


def claim_ports(settings: Any, *, hold: bool = True) -> socket.socket:
    """Bind the control port (returned, for uvicorn) and try the fixed data-plane ports.

    ``hold`` False only tries them all (nothing listens; the returned socket is closed): a port in use
    is named before the seconds a task takes to load, and nothing listens while it is checked.
    """
    try:
        control = _bind(settings.host, settings.port, listen=hold)
    except socket.gaierror as exc:
        raise PreflightError(f"--host {settings.host!r}: {exc.strerror}") from None
    except OSError as exc:
        raise PreflightError(f"control port {settings.port} on {settings.host} {_why(exc)}; choose another with "
                             "--port (HERMES_PORT)") from None
    others = (("data port", settings.data_port, "--data-port (HERMES_DATA_PORT; 0 picks a free one)"),
              ("collective port", settings.collective_port, "--collective-port (HERMES_COLLECTIVE_PORT; "
                                                            "0 picks a free one)"))
    for what, port, flag in others:
        if not port:
            continue
        try:
            _bind(settings.data_host, port, listen=False).close()
        except socket.gaierror as exc:
            control.close()
            raise PreflightError(f"--data-host {settings.data_host!r}: {exc.strerror}") from None
        except OSError as exc:
            control.close()
            raise PreflightError(f"{what} {port} on {settings.data_host} {_why(exc)}; choose another with "
                                 f"{flag}") from None
    if not hold:
        control.close()
    return control

