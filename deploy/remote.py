"""One SSH session to one device (paramiko): verified connect, scripts, SFTP.

Host keys are verified against a known_hosts file. An unknown key is refused
(``UnknownHostKey``, with its SHA256 fingerprint) unless trust on first use
was asked for explicitly, in which case the key is accepted and appended to
the known_hosts file. A key that differs from the recorded one is always
refused. Authentication is by key file or ssh-agent, never by password.

Scripts run under ``sh -s`` with the script on standard input: the remote
login shell does not matter, nothing needs shell-quoting twice, and values
the script exports (forwarded secrets) never appear in a process's argv.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import logging
import os
import select
import socket
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import paramiko

from hermes.deploy.inventory import Host

log = logging.getLogger(__name__)

MAX_OUTPUT_BYTES = 4 * 1024 * 1024
_KNOWN_HOSTS_LOCK = threading.Lock()


class RemoteError(Exception):
    """A failure talking to a device. ``kind`` is one of the KIND_* names below."""

    UNREACHABLE = "unreachable"
    AUTH = "auth"
    UNKNOWN_HOST_KEY = "unknown-host-key"
    HOST_KEY_MISMATCH = "host-key-mismatch"
    TIMEOUT = "timeout"
    SSH = "ssh"
    SFTP = "sftp"

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind

    def __str__(self) -> str:
        return f"{self.kind}: {self.args[0]}"


class UnknownHostKey(paramiko.SSHException):
    def __init__(self, hostname: str, key: paramiko.PKey) -> None:
        super().__init__(f"{hostname} is not in known_hosts")
        self.hostname = hostname
        self.key = key


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH-style ``SHA256:...`` fingerprint."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def known_hosts_name(host: str, port: int) -> str:
    """The name a known_hosts line uses for ``host:port`` (OpenSSH convention)."""
    return host if port == 22 else f"[{host}]:{port}"


class _RejectUnknown(paramiko.MissingHostKeyPolicy):
    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        raise UnknownHostKey(hostname, key)


class _TrustOnFirstUse(paramiko.MissingHostKeyPolicy):
    """Accept an unknown key and append it to the known_hosts file (explicit opt-in only)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        with _KNOWN_HOSTS_LOCK:
            existing = paramiko.HostKeys()
            if self.path.is_file():
                existing.load(str(self.path))
            recorded = existing.lookup(hostname) or {}
            if key.get_name() in recorded and recorded[key.get_name()] != key:
                # Another thread recorded a different key meanwhile: never overwrite.
                raise paramiko.BadHostKeyException(hostname, key, recorded[key.get_name()])
            if key.get_name() not in recorded:
                self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                with os.fdopen(fd, "a", encoding="ascii") as fh:
                    fh.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
                log.warning("trust on first use: accepted %s key %s for %s and recorded it in %s",
                            key.get_name(), fingerprint(key), hostname, self.path)
        client.get_host_keys().add(hostname, key.get_name(), key)


@dataclass(frozen=True)
class CommandResult:
    rc: int
    stdout: str
    stderr: str

    def fields(self) -> dict[str, str]:
        """``key=value`` lines of stdout as a dict (later lines win)."""
        out: dict[str, str] = {}
        for line in self.stdout.splitlines():
            key, sep, value = line.partition("=")
            if sep and key and " " not in key:
                out[key.strip()] = value.strip()
        return out

    def tail(self, lines: int = 5) -> str:
        text = (self.stderr.strip() or self.stdout.strip()).splitlines()
        return " | ".join(text[-lines:])


class RemoteSession:
    """``with RemoteSession(host, known_hosts=...) as s: s.run(script)``."""

    def __init__(self, host: Host, *, known_hosts: Path, trust_on_first_use: bool = False) -> None:
        self.host = host
        self.known_hosts = Path(known_hosts).expanduser()
        self.trust_on_first_use = trust_on_first_use
        self._client: paramiko.SSHClient | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self._aborted = False

    # ---- connection ---------------------------------------------------------

    def connect(self) -> RemoteSession:
        h = self.host
        client = paramiko.SSHClient()
        if self.known_hosts.is_file():
            try:
                # Not load_host_keys(): that would make paramiko rewrite the file.
                client.get_host_keys().load(str(self.known_hosts))
            except (OSError, paramiko.SSHException) as exc:
                raise RemoteError(RemoteError.SSH, f"cannot read known_hosts {self.known_hosts}: {exc}") from None
        client.set_missing_host_key_policy(
            _TrustOnFirstUse(self.known_hosts) if self.trust_on_first_use else _RejectUnknown())
        kwargs: dict[str, object] = {
            "hostname": h.host, "port": h.port, "username": h.user, "timeout": h.connect_timeout,
            "banner_timeout": h.connect_timeout, "auth_timeout": h.connect_timeout,
            "allow_agent": h.use_agent, "look_for_keys": h.key_file is None and h.use_agent,
            "passphrase": h.passphrase(),
        }
        if h.key_file is not None:
            if not h.key_file.is_file():
                raise RemoteError(RemoteError.AUTH, f"key_file {h.key_file} does not exist")
            kwargs["key_filename"] = str(h.key_file)
        where = f"{h.address}"
        log.debug("connecting to %s", where)
        try:
            client.connect(**kwargs)
        except UnknownHostKey as exc:
            client.close()
            raise RemoteError(
                RemoteError.UNKNOWN_HOST_KEY,
                f"{exc.hostname} presented {exc.key.get_name()} key {fingerprint(exc.key)}, which is not in "
                f"{self.known_hosts}; check the fingerprint on the device (ssh-keygen -lf "
                f"/etc/ssh/ssh_host_*_key.pub) and add it, or rerun with --trust-on-first-use",
            ) from None
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise RemoteError(
                RemoteError.HOST_KEY_MISMATCH,
                f"{exc.hostname} presented {fingerprint(exc.key)} but {self.known_hosts} records "
                f"{fingerprint(exc.expected_key)}: possible man-in-the-middle, refusing to connect",
            ) from None
        except paramiko.PasswordRequiredException:
            client.close()
            raise RemoteError(
                RemoteError.AUTH,
                f"key {h.key_file} is encrypted: set the environment variable named by key_passphrase_env "
                f"({h.key_passphrase_env or 'not set in the inventory'}) or load the key into ssh-agent",
            ) from None
        except paramiko.AuthenticationException as exc:
            client.close()
            what = f"key {h.key_file}" if h.key_file else "ssh-agent / default keys"
            raise RemoteError(RemoteError.AUTH, f"{where}: authentication failed with {what}: {exc}") from None
        except TimeoutError:
            client.close()
            raise RemoteError(RemoteError.UNREACHABLE,
                              f"{where}: no answer within {h.connect_timeout:g}s") from None
        except socket.gaierror as exc:
            client.close()
            raise RemoteError(RemoteError.UNREACHABLE, f"{where}: cannot resolve {h.host}: {exc}") from None
        except paramiko.SSHException as exc:
            client.close()
            if self._aborted:
                raise RemoteError(RemoteError.TIMEOUT, f"{where}: aborted (timeout)") from None
            raise RemoteError(RemoteError.SSH, f"{where}: {exc}") from None
        except OSError as exc:  # refused, no route, NoValidConnectionsError
            client.close()
            raise RemoteError(RemoteError.UNREACHABLE, f"{where}: {exc.strerror or exc}") from None
        self._client = client
        log.info("connected to %s (%s)", h.name, where)
        return self

    def close(self) -> None:
        if self._sftp is not None:
            with contextlib.suppress(Exception):  # closing a broken session
                self._sftp.close()
            self._sftp = None
        if self._client is not None:
            self._client.close()
            self._client = None

    def abort(self) -> None:
        """From another thread: drop the connection so a blocked call returns."""
        self._aborted = True
        client = self._client
        if client is not None:
            transport = client.get_transport()
            if transport is not None:
                transport.close()

    def __enter__(self) -> RemoteSession:
        return self.connect() if self._client is None else self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def client(self) -> paramiko.SSHClient:
        if self._client is None:
            raise RemoteError(RemoteError.SSH, f"{self.host.name}: not connected")
        return self._client

    # ---- commands -----------------------------------------------------------

    def run(self, script: str, *, timeout: float = 60.0) -> CommandResult:
        """Run a POSIX sh script (fed to ``sh -s``); stdout/stderr as text, bounded by ``timeout``."""
        transport = self.client.get_transport()
        if transport is None or not transport.is_active():
            raise RemoteError(RemoteError.SSH, f"{self.host.name}: the connection is closed")
        try:
            chan = transport.open_session(timeout=min(timeout, 30.0))
            chan.settimeout(timeout)
            chan.exec_command("sh -s")
            chan.sendall(script.encode())
            chan.shutdown_write()
        except (paramiko.SSHException, OSError) as exc:
            raise self._lost(exc) from None
        out, err = bytearray(), bytearray()
        deadline = time.monotonic() + timeout
        try:
            while True:
                while chan.recv_ready():
                    out += chan.recv(65536)
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(65536)
                if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                    break
                if len(out) + len(err) > MAX_OUTPUT_BYTES:
                    raise RemoteError(RemoteError.SSH, f"{self.host.name}: command output over {MAX_OUTPUT_BYTES} bytes")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RemoteError(RemoteError.TIMEOUT, f"{self.host.name}: command still running after {timeout:g}s")
                if chan.closed and not transport.is_active():
                    raise self._lost(EOFError("connection closed"))
                select.select([chan], [], [], min(left, 0.5))
            rc = chan.recv_exit_status()
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise self._lost(exc) from None
        finally:
            chan.close()
        result = CommandResult(rc, out.decode(errors="replace"), err.decode(errors="replace"))
        log.debug("%s: script exited %d", self.host.name, rc)
        return result

    def _lost(self, exc: BaseException) -> RemoteError:
        if self._aborted:
            return RemoteError(RemoteError.TIMEOUT, f"{self.host.name}: aborted (timeout)")
        return RemoteError(RemoteError.SSH, f"{self.host.name}: connection lost: {exc}")

    # ---- files --------------------------------------------------------------

    @property
    def sftp(self) -> paramiko.SFTPClient:
        if self._sftp is None:
            try:
                self._sftp = self.client.open_sftp()
            except (paramiko.SSHException, OSError) as exc:
                raise RemoteError(RemoteError.SFTP, f"{self.host.name}: cannot open SFTP: {exc}") from None
            self._sftp.get_channel().settimeout(120.0)
        return self._sftp

    def put(self, local: Path, remote: str) -> int:
        """Upload one file; returns its size (checked against the remote copy by paramiko)."""
        try:
            attrs = self.sftp.put(str(local), remote, confirm=True)
        except (OSError, paramiko.SSHException) as exc:
            raise RemoteError(RemoteError.SFTP, f"{self.host.name}: upload of {local.name} to {remote} failed: {exc}") from None
        log.info("%s: uploaded %s (%d bytes) to %s", self.host.name, local.name, attrs.st_size or 0, remote)
        return int(attrs.st_size or 0)

    def kind_of(self, remote: str) -> str | None:
        """``"file"``, ``"dir"``, another kind's name, or None when nothing is there."""
        try:
            mode = self.sftp.stat(remote).st_mode or 0
        except FileNotFoundError:
            return None
        except (OSError, paramiko.SSHException) as exc:
            raise RemoteError(RemoteError.SFTP, f"{self.host.name}: stat {remote}: {exc}") from None
        if stat.S_ISDIR(mode):
            return "dir"
        return "file" if stat.S_ISREG(mode) else "other"

    def get(self, remote: str, local: Path) -> int:
        """Download one file; returns its size."""
        local.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.sftp.get(remote, str(local))
        except (OSError, paramiko.SSHException) as exc:
            raise RemoteError(RemoteError.SFTP, f"{self.host.name}: download of {remote} failed: {exc}") from None
        size = local.stat().st_size
        log.info("%s: downloaded %s (%d bytes) to %s", self.host.name, remote, size, local)
        return size

    def get_tree(self, remote: str, local: Path) -> list[tuple[str, int]]:
        """Download a directory recursively (regular files only); [(relative path, bytes)]."""
        files: list[tuple[str, int]] = []
        stack = [PurePosixPath(remote)]
        root = PurePosixPath(remote)
        while stack:
            d = stack.pop()
            try:
                entries = self.sftp.listdir_attr(str(d))
            except (OSError, paramiko.SSHException) as exc:
                raise RemoteError(RemoteError.SFTP, f"{self.host.name}: listing {d} failed: {exc}") from None
            for e in sorted(entries, key=lambda a: a.filename):
                path = d / e.filename
                mode = e.st_mode or 0
                if stat.S_ISDIR(mode):
                    stack.append(path)
                elif stat.S_ISREG(mode):
                    rel = path.relative_to(root)
                    files.append((str(rel), self.get(str(path), local.joinpath(*rel.parts))))
        return files
