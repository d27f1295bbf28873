"""A launcher's output folder that holds an earlier run: that run's outputs are moved aside, never deleted.

The server refuses to start a new run among another run's outputs (it would
overwrite the user's models); the testbed and the bench, which own their
``--out``, make room by moving the earlier run into
``OUT/previous/<UTC time>/`` instead, so re-running a command never loses
what the last one produced.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

# What a testbed run leaves at the top of OUT.
RUN_FILES = ("events.jsonl", "summary.json", "server_summary.json", "admin.token", "model-best.safetensors",
             "model-final.safetensors")
RUN_DIRS = ("logs", "checkpoints", "tensorboard")


def set_aside(out: Path, *, clock: Callable[[], float] = time.time) -> Path | None:
    """Move an earlier run's files and folders in ``out`` to ``out/previous/<UTC time>``; None when there is none."""
    present = [out / name for name in RUN_FILES if (out / name).exists()]
    present += [out / name for name in RUN_DIRS if (out / name).is_dir() and any((out / name).iterdir())]
    if not present:
        return None
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(clock()))
    dest, n = out / "previous" / stamp, 2
    while dest.exists():
        dest, n = out / "previous" / f"{stamp}-{n}", n + 1
    dest.mkdir(parents=True)
    for path in present:
        path.rename(dest / path.name)
    log.warning("%s held an earlier run: its outputs were moved to %s", out, dest)
    return dest
