"""The machine a benchmark ran on, printed at the top of every report.

Lives in the package so that an installed ``hermes-bench`` has it; the
scripts in ``benchmarks/`` import it from here.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any


def loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or ""


def machine_info() -> dict[str, Any]:
    import crc32c
    import msgpack
    import numpy as np
    import torch
    import zmq

    usable: int | None
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return {
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": usable,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "numpy": np.__version__,
        "pyzmq": zmq.__version__,
        "libzmq": zmq.zmq_version(),
        "msgpack": ".".join(map(str, msgpack.version)),
        "crc32c_hardware": bool(getattr(crc32c, "hardware_based", False)),
        "loadavg_at_start": loadavg(),
    }


def versions() -> dict[str, str | None]:
    """Versions of what a testbed run depends on, for the report."""
    from importlib import metadata

    out: dict[str, str | None] = {}
    for dist in ("hermes-edge", "torch", "numpy", "pyzmq", "fastapi", "uvicorn", "kafka-python", "matplotlib"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def print_table(title: str, header: list[str], rows: list[list[str]]) -> None:
    """A plain aligned table: first column left, the rest right-aligned."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    print(f"\n{title}")
    print("  ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w) in enumerate(zip(header, widths))))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))))
