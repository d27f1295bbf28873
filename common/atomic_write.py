"""One way to replace a file: a unique temporary file in the same folder, then ``os.replace``.

A reader never sees half a file, and writers that race (processes, or agents
running as threads of one process, as ``hermes.train`` starts them) each
write their own temporary file and leave one whole result: the last rename
wins. ``durable`` adds the fsyncs a crash-consistent checkpoint needs (the
file before the rename, the folder after it); results and caches skip them.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

Content = bytes | str | Callable[[BinaryIO], object]


def fsync_dir(path: Path) -> None:
    """Make a rename in ``path`` survive a crash (POSIX: the folder's entry is data too)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike[str], content: Content, *, durable: bool = False) -> None:
    """Replace ``path`` with ``content`` (bytes, text as UTF-8, or a function that writes to a binary file)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            if isinstance(content, str):
                fh.write(content.encode())
            elif isinstance(content, bytes):
                fh.write(content)
            else:
                content(fh)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(path.parent)
