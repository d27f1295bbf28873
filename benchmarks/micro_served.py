"""Where a served request's loop-thread CPU goes (issue 31): ``Engine.handle`` against the rest (the data plane:
receive, admission, task, reply's send, the loop's wake-ups), and the agent's thread, for top-k / int8 / PowerSGD
pushes or cached int8 pulls through the real ``DataPlane`` in a process of its own.

    python benchmarks/micro_served.py topk|int8|powersgd|pull [N] [--dataplane FILE]

``--dataplane FILE``: the server's ``DataPlane`` class taken from FILE instead (an older ``server/dataplane.py``,
e.g. ``git show REV:server/dataplane.py > FILE``), to compare two data planes on the same engine. A development
tool (thread CPU, nice 15 is fine): the comparison with the bare pair is ``hermes-bench micro``.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from pathlib import Path
from typing import Any

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))

_HANDLE = {"seconds": 0.0, "calls": 0}


def child(codec: str) -> None:
    """The server side: micro_profile's engine and data plane, ``Engine.handle`` timed in its thread."""
    import micro_profile

    from hermes.server import dataplane
    from hermes.server.engine import core

    if os.environ.get("HERMES_MICRO_DATAPLANE"):
        import importlib.util

        spec = importlib.util.spec_from_file_location("dataplane_other", os.environ["HERMES_MICRO_DATAPLANE"])
        assert spec is not None and spec.loader is not None
        other = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(other)
        dataplane.DataPlane = other.DataPlane  # type: ignore[misc]
    handle = core.Engine.handle

    @functools.wraps(handle)
    async def timed(self: Any, frames: Any, header: Any = None, size: Any = None) -> Any:
        # Every offload of a 1M-parameter request runs inline: the thread's CPU across the await is handle's.
        t0 = time.thread_time()
        try:
            return await handle(self, frames, header, size)
        finally:
            _HANDLE["seconds"] += time.thread_time() - t0
            _HANDLE["calls"] += 1

    core.Engine.handle = timed  # type: ignore[method-assign]
    stop = dataplane.DataPlane.stop

    async def report(self: Any) -> None:
        print(f"  server Engine.handle {_HANDLE['seconds'] / max(1, _HANDLE['calls']) * 1e3:.3f} ms CPU a request",
              file=sys.stderr)
        await stop(self)

    dataplane.DataPlane.stop = report  # type: ignore[method-assign]
    micro_profile.plane_main(codec, "-")


def parent(mode: str, n: int) -> None:
    import micro_profile
    import torch

    from hermes.common.wire import MsgType

    torch.set_num_threads(1)
    codec = "topk" if mode == "pull" else mode
    with micro_profile.plane_client([sys.executable, __file__, "--child", codec], codec) as (dc, enc, body):
        push = micro_profile.applied_pusher(dc, body, enc.data)

        def pull() -> None:
            rep = dc.request(MsgType.PULL_MODEL, {"dtype": "float32", "codec": {"name": "int8", "chunk": 1024}})
            assert rep.payload is not None

        push()
        fn = pull if mode == "pull" else push
        for _ in range(50):
            fn()
        t0, w0 = time.thread_time(), time.perf_counter()
        for _ in range(n):
            fn()
        print(f"{mode}: agent thread {(time.thread_time() - t0) / n * 1e3:.3f} ms CPU, wall "
              f"{(time.perf_counter() - w0) / n * 1e3:.3f} ms a request (load {os.getloadavg()[0]:.1f})")


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        child(argv[1])
        return 0
    args = list(argv)
    if "--dataplane" in args:
        i = args.index("--dataplane")
        os.environ["HERMES_MICRO_DATAPLANE"] = str(Path(args[i + 1]).resolve())
        del args[i : i + 2]
    if not args or args[0] not in ("topk", "int8", "powersgd", "pull"):
        print(__doc__, file=sys.stderr)
        return 2
    parent(args[0], int(args[1]) if len(args) > 1 else 1000)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
