"""Where Hermes keeps what it measured or generated between runs on one machine.

One rule for every such cache: an environment variable names the place (or
``off``, ``0``, ``none``, ``no`` to keep nothing), else it lives under
``$XDG_CACHE_HOME/hermes/`` (``~/.cache`` without it).
"""

from __future__ import annotations

import os
from pathlib import Path

_OFF = ("off", "0", "none", "no")


def user_cache(env_var: str, name: str) -> Path | None:
    """``$env_var`` as a path, None when it says off, else ``$XDG_CACHE_HOME/hermes/<name>``."""
    env = os.environ.get(env_var, "")
    if env.lower() in _OFF:
        return None
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "hermes" / name
