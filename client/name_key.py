"""The agent's name key: its own secret for its worker name, kept across restarts.

The server gives a name to the first key that registers it and to no other
(server/registry.py), so an agent restarted after a crash must present the
same key again. It lives in ``$HERMES_AGENT_STATE`` (``off`` keeps none:
each process then has a fresh key and cannot take its name back after a
restart), else ``$XDG_CACHE_HOME/hermes/agent/``, one file per server and
name, mode 0600, created atomically so two processes starting together end
up with the same key.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
from pathlib import Path

from hermes.common.cache_paths import user_cache

log = logging.getLogger(__name__)

ENV = "HERMES_AGENT_STATE"
KEY_BYTES = 32


def key_path(server: str, name: str) -> Path | None:
    """Where this agent keeps its key for ``name`` on ``server`` (None: persistence is off)."""
    base = user_cache(ENV, "agent")
    if base is None:
        return None
    # A key per server: a server that learned it cannot replay it to another server.
    where = hashlib.sha256(server.rstrip("/").encode()).hexdigest()[:16]
    return base / "name-keys" / f"{name}@{where}.key"


def name_key(server: str, name: str) -> str:
    """The key this agent proves ``name`` with: read from its file, or made and written there."""
    path = key_path(server, name)
    if path is None:
        return secrets.token_urlsafe(KEY_BYTES)
    return key_at(path)


def key_at(path: Path) -> str:
    """The key kept in ``path``: read, or made and written there (0600, the first writer's key wins)."""
    try:
        return _read(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise ValueError(f"name key {path}: {exc.strerror or exc}") from None
    key = secrets.token_urlsafe(KEY_BYTES)
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(key + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)  # fails if another process got there first: its key wins
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
        return _read(path)
    except OSError as exc:
        raise ValueError(f"name key {path}: cannot write it ({exc.strerror or exc}); set {ENV} to a writable "
                         f"directory, or {ENV}=off to keep none (a restarted agent then needs a new --name)") from None


def _read(path: Path) -> str:
    key = path.read_text().strip()
    if len(key) < 16:
        raise ValueError(f"name key {path} is damaged (too short); delete it and give the agent a new --name")
    return key
