"""The server's cost of scoring a model for the loss aggregation (Hermes Eq. 5-6): ``LossProbe.loss_of``.

    python benchmarks/sim_probe_cost.py [--repeats 20] [--hidden 320] [--samples 512]

Builds the production ``Engine`` for ``hermes-paper`` on mnist1d 20k with the CNN at ``--hidden`` (the paper's
size: 320), times ``loss_of`` on the global model (``time.process_time``, one torch thread: CPU seconds, which
other processes' load inflates less than wall seconds) and prints the median with the forward FLOPs it did
(``torch.utils.flop_counter``, as the simulator counts them) and their ratio: the FLOP/s that
``sim/server_cost.py``'s ``PROBE_FLOPS`` holds.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from hermes.common.config import build_config
from hermes.deploy.bench.machine import loadavg
from hermes.server.engine import Engine
from hermes.server.events import EventLog
from hermes.server.metrics import ServerMetrics


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--hidden", type=int, default=320)
    p.add_argument("--samples", type=int, default=512)
    a = p.parse_args()
    torch.set_num_threads(1)
    cfg = build_config("hermes-paper", dataset="mnist1d", num_samples=20000, model_kwargs={"hidden": a.hidden},
                       **{"loss.eval_samples": a.samples})
    out = tempfile.mkdtemp()
    engine = Engine(cfg, metrics=ServerMetrics(), events=EventLog(out + "/events.jsonl"), max_workers=4,
                    max_message_bytes=1 << 28, out_dir=out)
    probe = engine.policies.aggregation.probe
    assert probe is not None
    flat = engine.state.snapshot()[1]
    with FlopCounterMode(display=False) as fc:
        probe.loss_of(flat)
    flops = fc.get_total_flops()
    load = loadavg()
    times = []
    for _ in range(a.repeats):
        t0 = time.process_time()
        probe.loss_of(flat)
        times.append(time.process_time() - t0)
    med = statistics.median(times)
    print(f"loss_of on {a.samples} samples, hidden {a.hidden}: {flops / 1e6:.1f} MFLOP forward, median "
          f"{med * 1e3:.2f} ms CPU [{min(times) * 1e3:.2f}-{max(times) * 1e3:.2f}] over {a.repeats}: "
          f"{flops / med / 1e9:.2f} GFLOP/s; load average {load}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
