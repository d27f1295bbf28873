"""The run's output folder (OUT): never another run's, unless the operator says so.

A server that starts in an OUT holding another run's outputs (its summary,
its model files, an event log in which a server started a run) refuses, unless it resumes that run
(``--resume``: the event log goes on, the files are rewritten at the end) or
is told to replace them (``--overwrite``: those files are deleted first).
Anything else in OUT (the testbed's logs, the operator's notes) is left alone.
Without ``--out``, ``hermes-server`` makes a fresh ``runs/<UTC time>-<preset>``.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

log = logging.getLogger(__name__)

# What a server run leaves in OUT. admin.token is not among them: it is a
# per-start secret, replaced on every start.
RUN_OUTPUTS = ("server_summary.json", "model-final.safetensors", "model-best.safetensors", "events.jsonl")
REPLACED_ON_OVERWRITE = (*RUN_OUTPUTS, "admin.token")


class OutDirError(Exception):
    """An output folder that holds another run's outputs, or cannot be used."""


# How the engine's first event is written (events.EventLog: json.dumps with the default separators).
_RUN_START = b'"event": "run_start"'


def _started_a_run(events: Path) -> bool:
    """Whether a server started a run in this event log (the testbed writes its own lines there first)."""
    with open(events, "rb") as fh:
        head = fh.read(1 << 20)  # run_start is among the first lines of a run
    return _RUN_START in head


def run_outputs(out: Path) -> list[str]:
    """The names of another run's outputs present in ``out`` (an event log without a run is none)."""
    found = []
    for name in RUN_OUTPUTS:
        path = out / name
        try:
            if path.is_file() and (name != "events.jsonl" or _started_a_run(path)):
                found.append(name)
        except OSError:
            continue
    return found


def check_out_dir(out: str | Path, *, resume: bool, overwrite: bool) -> list[str]:
    """Refuse an OUT holding another run's outputs unless resuming or overwriting; read only.

    Returns the outputs found (what ``--overwrite`` will replace).
    """
    d = Path(out)
    if d.exists() and not d.is_dir():
        raise OutDirError(f"--out {d}: not a directory")
    found = run_outputs(d) if d.is_dir() else []
    if found and not (resume or overwrite):
        raise OutDirError(f"--out {d} holds another run's outputs ({', '.join(found)}): continue that run with "
                          "--resume CHECKPOINT_DIR, replace them with --overwrite, or choose another --out")
    return found


def prepare_out_dir(out: str | Path, *, resume: bool, overwrite: bool) -> None:
    """Check OUT, create it, and with ``overwrite`` (and not resuming) delete the previous run's outputs."""
    d = Path(out)
    found = check_out_dir(d, resume=resume, overwrite=overwrite)
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutDirError(f"--out {d}: cannot create it ({exc.strerror or exc})") from None
    if overwrite and not resume:
        for name in REPLACED_ON_OVERWRITE:
            (d / name).unlink(missing_ok=True)
        if found:
            log.warning("--overwrite: replaced the previous run's %s in %s", ", ".join(found), d)


def default_out_dir(preset: str, *, root: str | Path = "runs", now: float | None = None) -> Path:
    """``runs/<UTC time>-<preset>``, with a numeric suffix if a server started in the same second took it."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    base = Path(root) / f"{stamp}-{preset}"
    candidate, n = base, 1
    while candidate.exists():
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")
    return candidate
