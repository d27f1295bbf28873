"""Where a real ``hermes-server``'s loop thread spends a compressed push (issue 31): the server as ``hermes-bench
micro`` starts it (``bench_foundation.ServerProcess``'s arguments, asp, the 1M mlp), run under cProfile (thread CPU)
only while one agent sends top-k pushes, then the profile's tables.

    python benchmarks/micro_server_profile.py [--pushes 600] [--top 30] [--out PROFILE]

Prints the loop thread's CPU a push (schedstat, the profiler's own cost included), the loop's iterations a push
(``_run_once`` calls) and Python calls a push, then cProfile's tables by self time and by calls. Unlike
``micro_profile.py --served`` (the engine and data plane alone) this is the whole server: control plane, event
log, metrics, evaluation timer. A development tool (nice 15 is fine): the comparison is ``hermes-bench micro``.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import runpy
import signal
import sys
import tempfile
import time
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))


def server_main(out: str, argv: list[str]) -> None:
    """The child: ``hermes.server.cli`` under a profiler that SIGUSR1 starts and SIGUSR2 stops and writes."""
    prof = cProfile.Profile(time.thread_time)

    def dump(*_: object) -> None:
        prof.disable()
        prof.dump_stats(out)

    signal.signal(signal.SIGUSR1, lambda *_: prof.enable())
    signal.signal(signal.SIGUSR2, dump)
    sys.argv = ["hermes-server", *argv]
    runpy.run_module("hermes.server.cli", run_name="__main__")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pushes", type=int, default=600)
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--out", default=None, help="keep the profile here (default: a temporary file)")
    args = p.parse_args(argv)

    import torch
    from bench_foundation import JOIN_TOKEN, MLP_HIDDEN, free_ports, start, wait_healthy
    from micro_profile import applied_pusher

    from hermes.client.transport import ControlClient, DataClient
    from hermes.common.codecs import TopKCodec
    from hermes.common.control_messages import RegisterRequest
    from hermes.common.tensors import ModelSpec
    from hermes.common.wire import MsgType

    tmp = tempfile.TemporaryDirectory(prefix="hermes-server-profile-")
    out = args.out or str(Path(tmp.name) / "server.prof")
    http, data = free_ports(2)
    server_args = ["--host", "127.0.0.1", "--port", str(http), "--data-host", "127.0.0.1", "--data-port", str(data),
                   "--advertise-host", "127.0.0.1", "--log-level", "warning", "--set", "preset=asp",
                   "--set", "model=mlp", "--set", "dataset=digits",
                   "--set", "model_kwargs=" + json.dumps({"hidden": MLP_HIDDEN["1M"]}), "--set", "eval_max_samples=1"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("HERMES_")} | {
        "HERMES_JOIN_TOKEN": JOIN_TOKEN, "OMP_NUM_THREADS": "1"}
    log_path = Path(tmp.name) / "server.log"
    proc = start([sys.executable, __file__, "--server", out, *server_args], log_path=log_path, env=env)
    try:
        url = f"http://127.0.0.1:{http}"
        wait_healthy(proc, url, timeout=120, log_path=log_path)
        reg = ControlClient(url, join_token=JOIN_TOKEN).register(RegisterRequest(name="profile", threads=1))
        spec = ModelSpec.from_dict(reg.model_spec)
        dc = DataClient(reg.data_plane, reg.worker_id, reg.token, timeout=60.0)
        version = dc.request(MsgType.PULL_MODEL, {"dtype": "float32"}).header.model_version
        delta = torch.randn(spec.numel, generator=torch.Generator().manual_seed(1)) * 1e-6
        enc = TopKCodec(0.01).encode(delta, spec.shapes)
        body = {"samples": 32, "loss": 1.0, "codec": enc.spec.model_dump(exclude_none=True)}

        push = applied_pusher(dc, body, enc.data, version)

        def loop_cpu() -> float:
            return int(Path(f"/proc/{proc.pid}/task/{proc.pid}/schedstat").read_text().split()[0]) / 1e9

        for _ in range(50):
            push()
        os.kill(proc.pid, signal.SIGUSR1)
        push()  # the signal is handled between two of the loop's callbacks: this push's reply says it was
        c0 = loop_cpu()
        for _ in range(args.pushes):
            push()
        c1 = loop_cpu()
        os.kill(proc.pid, signal.SIGUSR2)
        push()
        dc.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    stats = pstats.Stats(out)
    raw = stats.stats  # type: ignore[attr-defined]
    runs = sum(v[1] for k, v in raw.items() if k[2] == "_run_once")
    calls = sum(v[1] for v in raw.values())
    n = args.pushes + 1
    print(f"loop thread: {(c1 - c0) / args.pushes * 1e3:.3f} ms CPU a push under the profiler, "
          f"{runs / n:.2f} loop iterations and {calls / n:.0f} Python-level calls a push ({n} pushes profiled)")
    stats.sort_stats("tottime").print_stats(args.top)
    stats.sort_stats("ncalls").print_stats(args.top)
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--server"]:
        server_main(sys.argv[2], sys.argv[3:])
    else:
        sys.exit(main())
