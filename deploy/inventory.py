"""Inventory of edge devices for ``hermes-deploy``: a TOML (or YAML) file.

::

    known_hosts = "~/.ssh/known_hosts"      # optional; this is the default

    [defaults]                              # optional; any host field
    user = "hermes"
    key_file = "~/.ssh/hermes_ed25519"
    python = "python3"
    server = "http://10.0.0.5:8000"

    [[hosts]]
    name = "jetson-1"                       # unique; also the agent's --name
    host = "10.0.0.21"
    threads = 4
    device = "cuda"

Every value is checked when the file is loaded; an error names the file, the
host and the field. Passwords have no place in the file: authenticate with a
key file or an ssh-agent; a key's passphrase comes from the environment
variable that ``key_passphrase_env`` names.
"""

from __future__ import annotations

import getpass
import logging
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
DEPS_MODES = ("full", "present")
TORCH_BUILDS = ("cpu", "cuda", "pypi")
# Where the CPU-only torch wheels live (Linux x86-64 and aarch64, macOS, Windows).
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_EXTRA_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
# Refused outright, wherever they appear: no secrets in inventory files.
_SECRET_FIELDS = ("password", "passwd", "passphrase", "key_passphrase", "sudo_password", "secret", "token")
# Environment variables whose values are secrets: forward_env, never env.
_SECRET_ENV_RE = re.compile(r"PASSWORD|PASSWD|PASSPHRASE|SECRET|TOKEN|API_KEY|PRIVATE_KEY", re.IGNORECASE)


class InventoryError(ValueError):
    """The inventory file is unreadable or a value in it is invalid."""


@dataclass(frozen=True)
class Host:
    """One edge device and how to run the agent on it."""

    name: str
    host: str
    port: int = 22
    user: str = field(default_factory=getpass.getuser)
    key_file: Path | None = None
    # Offer the keys of a running ssh-agent (and ~/.ssh/id_*) when no key_file is given.
    use_agent: bool = True
    key_passphrase_env: str | None = None
    python: str = "python3"
    # Relative paths are relative to the remote user's home directory.
    workdir: str = "hermes-edge"
    threads: int | None = None
    device: str | None = None
    server: str | None = None
    # The venv sees the system's site-packages (torch preinstalled on the device).
    system_site_packages: bool = False
    # "full": pip installs the wheel with its dependencies; "present": --no-deps --no-index.
    deps: str = "full"
    extras: tuple[str, ...] = ()
    pip_args: tuple[str, ...] = ()
    # Which torch ``install`` puts in the venv before the wheel (deps "full" only):
    # "cpu" the CPU-only build from the PyTorch index (PyPI's default on x86-64 is
    # the 5+ GB CUDA build), "cuda"/"pypi" whatever the index pip uses serves, or a
    # requirement such as "torch==2.5.1" installed as written.
    torch: str = "cpu"
    client_args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    # Names of variables whose values are taken from the deploying machine's
    # environment at start (secrets such as HERMES_JOIN_TOKEN): never in the file.
    forward_env: tuple[str, ...] = ()
    connect_timeout: float = 10.0

    @property
    def address(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"

    def passphrase(self) -> str | None:
        if not self.key_passphrase_env:
            return None
        return os.environ.get(self.key_passphrase_env)


@dataclass(frozen=True)
class Inventory:
    hosts: tuple[Host, ...]
    known_hosts: Path
    source: Path | None = None

    def select(self, names: list[str] | None) -> tuple[Host, ...]:
        """The named hosts in inventory order (all when ``names`` is empty)."""
        if not names:
            return self.hosts
        known = {h.name for h in self.hosts}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise InventoryError(f"unknown host(s) {', '.join(unknown)}; the inventory has {', '.join(sorted(known))}")
        wanted = set(names)
        return tuple(h for h in self.hosts if h.name in wanted)


_HOST_FIELDS = {f for f in Host.__dataclass_fields__}


def load_inventory(path: str | os.PathLike[str]) -> Inventory:
    """Read and validate an inventory file (``.toml``, or ``.yaml``/``.yml`` when PyYAML is installed)."""
    path = Path(path).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InventoryError(f"{path}: cannot read the inventory: {exc.strerror or exc}") from None
    if path.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise InventoryError(f"{path}: YAML inventories need PyYAML (pip install pyyaml), or use TOML") from None
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise InventoryError(f"{path}: not valid YAML: {exc}") from None
    else:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise InventoryError(f"{path}: not valid TOML: {exc}") from None
    inv = parse_inventory(data, base_dir=path.parent, source=path)
    log.debug("loaded %d host(s) from %s", len(inv.hosts), path)
    return inv


def parse_inventory(data: Any, *, base_dir: Path | None = None, source: Path | None = None) -> Inventory:
    where = str(source) if source else "inventory"
    base_dir = base_dir or Path.cwd()
    if not isinstance(data, dict):
        raise InventoryError(f"{where}: expected a table at the top level")
    _refuse_secrets(data, where)
    unknown = set(data) - {"known_hosts", "defaults", "hosts"}
    if unknown:
        raise InventoryError(f"{where}: unknown top-level key(s) {', '.join(sorted(unknown))} "
                             "(expected known_hosts, defaults, hosts)")
    defaults = data.get("defaults", {})
    if not isinstance(defaults, dict):
        raise InventoryError(f"{where}: 'defaults' must be a table")
    _refuse_secrets(defaults, f"{where}: defaults")
    for key in ("name", "host"):
        if key in defaults:
            raise InventoryError(f"{where}: defaults: {key!r} cannot have a default")
    raw_hosts = data.get("hosts")
    if not isinstance(raw_hosts, list) or not raw_hosts:
        raise InventoryError(f"{where}: no hosts: add at least one [[hosts]] table")
    hosts: list[Host] = []
    seen: set[str] = set()
    for i, raw in enumerate(raw_hosts):
        if not isinstance(raw, dict):
            raise InventoryError(f"{where}: hosts[{i}] must be a table")
        label = f"{where}: host {raw.get('name', f'#{i + 1}')!s}"
        _refuse_secrets(raw, label)
        merged = {**defaults, **raw}
        host = _parse_host(merged, label, base_dir)
        if host.name in seen:
            raise InventoryError(f"{label}: field 'name': duplicate host name {host.name!r}")
        seen.add(host.name)
        hosts.append(host)
    known_hosts = data.get("known_hosts", DEFAULT_KNOWN_HOSTS)
    if not isinstance(known_hosts, str) or not known_hosts:
        raise InventoryError(f"{where}: 'known_hosts' must be a path")
    return Inventory(tuple(hosts), _resolve(known_hosts, base_dir), source)


def _refuse_secrets(table: dict[str, Any], where: str) -> None:
    """No password-like keys in a table (the file's top level, defaults, or a host)."""
    for key in table:
        if isinstance(key, str) and key.lower() in _SECRET_FIELDS:
            raise InventoryError(
                f"{where}: field {key!r}: no passwords or secrets in inventory files; "
                "authenticate with key_file or an ssh-agent (a key passphrase comes from the "
                "environment variable named by key_passphrase_env)")


def _resolve(value: str, base_dir: Path) -> Path:
    p = Path(value).expanduser()
    return p if p.is_absolute() else (base_dir / p).resolve()


def _parse_host(raw: dict[str, Any], label: str, base_dir: Path) -> Host:
    unknown = set(raw) - _HOST_FIELDS
    if unknown:
        raise InventoryError(f"{label}: unknown field(s) {', '.join(sorted(unknown))}; "
                             f"known: {', '.join(sorted(_HOST_FIELDS))}")

    def bad(name: str, why: str) -> InventoryError:
        return InventoryError(f"{label}: field {name!r}: {why}")

    def string(name: str, *, required: bool = False) -> str | None:
        v = raw.get(name)
        if v is None:
            if required:
                raise bad(name, "is required")
            return None
        if not isinstance(v, str) or not v.strip():
            raise bad(name, f"expected a non-empty string, got {v!r}")
        return v.strip()

    def required_string(name: str) -> str:
        v = string(name)
        if v is None:
            raise bad(name, "is required")
        return v

    def boolean(name: str) -> bool | None:
        v = raw.get(name)
        if v is not None and not isinstance(v, bool):
            raise bad(name, f"expected true or false, got {v!r}")
        return v

    def strings(name: str) -> tuple[str, ...]:
        v = raw.get(name, [])
        if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
            raise bad(name, f"expected a list of strings, got {v!r}")
        return tuple(v)

    fields: dict[str, Any] = {}
    name = required_string("name")
    if not _NAME_RE.match(name):
        raise bad("name", f"{name!r}: use letters, digits, '.', '_' and '-' (at most 63)")
    fields["name"] = name
    fields["host"] = required_string("host")
    if any(c.isspace() for c in fields["host"]):
        raise bad("host", f"{fields['host']!r} contains whitespace")

    port = raw.get("port", 22)
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        raise bad("port", f"expected an integer in 1..65535, got {port!r}")
    fields["port"] = port
    for key in ("user", "python", "workdir", "device", "server", "key_passphrase_env"):
        v = string(key)
        if v is not None:
            fields[key] = v
    if "server" in fields and not fields["server"].startswith(("http://", "https://")):
        raise bad("server", f"{fields['server']!r}: expected an http:// or https:// URL")
    if "key_passphrase_env" in fields and not _ENV_RE.match(fields["key_passphrase_env"]):
        raise bad("key_passphrase_env", "expected the name of an environment variable")

    key_file = string("key_file")
    if key_file is not None:
        # Resolved here, checked at connect time: a missing key fails that host only.
        fields["key_file"] = _resolve(key_file, base_dir)
    use_agent = boolean("use_agent")
    # With an explicit key file, only that key is offered unless use_agent says otherwise.
    fields["use_agent"] = use_agent if use_agent is not None else key_file is None
    if key_file is None and not fields["use_agent"]:
        raise bad("use_agent", "false, and no key_file: nothing to authenticate with")

    for key in ("system_site_packages",):
        flag = boolean(key)
        if flag is not None:
            fields[key] = flag
    threads = raw.get("threads")
    if threads is not None:
        if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
            raise bad("threads", f"expected a positive integer, got {threads!r}")
        fields["threads"] = threads
    timeout = raw.get("connect_timeout")
    if timeout is not None:
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not 0 < timeout <= 300:
            raise bad("connect_timeout", f"expected seconds in (0, 300], got {timeout!r}")
        fields["connect_timeout"] = float(timeout)
    deps = raw.get("deps", "full")
    if deps not in DEPS_MODES:
        raise bad("deps", f"expected one of {', '.join(DEPS_MODES)}, got {deps!r}")
    fields["deps"] = deps
    extras = strings("extras")
    for e in extras:
        if not _EXTRA_RE.match(e):
            raise bad("extras", f"{e!r} is not an extra name")
    fields["extras"] = extras
    fields["pip_args"] = strings("pip_args")
    torch = string("torch")
    if torch is not None:
        if any(c.isspace() for c in torch) or not (torch in TORCH_BUILDS or torch.startswith("torch")):
            raise bad("torch", f"expected {', '.join(TORCH_BUILDS)} or a requirement like 'torch==2.5.1', got {torch!r}")
        fields["torch"] = torch
    fields["client_args"] = strings("client_args")
    env = raw.get("env", {})
    if not isinstance(env, dict):
        raise bad("env", f"expected a table of NAME = \"value\", got {env!r}")
    for k, v in env.items():
        if not isinstance(k, str) or not _ENV_RE.match(k):
            raise bad("env", f"{k!r} is not an environment variable name")
        if not isinstance(v, (str, int, float)) or isinstance(v, bool):
            raise bad("env", f"{k}: expected a string or a number, got {v!r}")
        if _SECRET_ENV_RE.search(k):
            raise bad("env", f"{k} looks like a secret: list it in forward_env and set it in the "
                             "environment of hermes-deploy instead of writing its value here")
    fields["env"] = tuple((k, str(v)) for k, v in env.items())
    forward = strings("forward_env")
    for k in forward:
        if not _ENV_RE.match(k):
            raise bad("forward_env", f"{k!r} is not an environment variable name")
    fields["forward_env"] = forward
    return Host(**fields)
