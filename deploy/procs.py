"""Stopping the process groups our launchers start (testbed agents, server, broker)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess

log = logging.getLogger(__name__)


def terminate_group(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM the process's group, SIGKILL whatever is left after ``grace``.

    The launchers start each child in a session of its own, so the group
    also holds anything the child started (the SIGKILL sweep reaches a
    killed parent's children too).
    """
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            log.warning("pid %d still up %.0fs after SIGTERM; killing it", proc.pid, grace)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
