"""Generated data sets kept on disk between runs, so a server does not generate them again.

Generating mnist1d took 11 s for 20k samples on our 2-core machine idle and
about 20 s beside four agents (2026-11-26): most of every bench run's
start-up. The arrays of a generation are written once to
``HERMES_DATA_CACHE`` (a directory, or ``off``), else
``$XDG_CACHE_HOME/hermes/datasets`` (``~/.cache`` without it), under a name
that hashes everything the generation depends on; a later load with the
same inputs reads them back (a few ms). A file that cannot be read is
generated again and replaced; a cache that cannot be written is skipped.
"""

from __future__ import annotations

import hashlib
import json
import logging
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from hermes.common.atomic_write import write_atomic
from hermes.common.cache_paths import user_cache

log = logging.getLogger(__name__)


def cache_dir() -> Path | None:
    """Where generated data sets are kept; None when ``HERMES_DATA_CACHE`` says ``off``."""
    return user_cache("HERMES_DATA_CACHE", "datasets")


def cached_arrays(kind: str, key: dict[str, Any], make: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """``make()``'s arrays, read from the cache when a call with the same ``kind`` and ``key`` wrote them."""
    folder = cache_dir()
    if folder is None:
        return make()
    digest = hashlib.sha256(json.dumps([kind, key], sort_keys=True, default=str).encode()).hexdigest()[:20]
    path = folder / f"{kind}-{digest}.npz"
    if path.exists():
        try:
            with np.load(path, allow_pickle=False) as f:
                arrays = {name: f[name] for name in f.files}
            log.debug("%s read from the cache %s", kind, path)
            return arrays
        except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:
            log.warning("cached %s at %s cannot be read (%s): generating it again", kind, path, exc)
    arrays = make()
    _write(path, arrays)
    return arrays


def _write(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write-then-rename, so a reader never sees half a file and two writers leave one whole one."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, lambda f: np.savez(f, **arrays))  # type: ignore[arg-type]  # (mypy binds the names to savez's flags)
    except OSError as exc:
        log.info("data set cache %s not written (%s); set HERMES_DATA_CACHE to a writable folder or 'off'",
                 path.parent, exc)
