"""Wall time of one simulation trained here and on a local Ray instance, side by side, and whether they agree.

    python benchmarks/sim_ray.py --devices 8 --repeats 3 --max-updates 100

Runs alternate (here, ray, here, ray, ...) in fresh output folders under a temporary directory; prints each
run's wall seconds, the medians and their ratio, the load average before and after, and whether every run's
deterministic summary equals the first's. Ray's start-up is outside the timed part (``ray.init`` once).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--devices", type=int, default=8)
    p.add_argument("--population", default="generated")
    p.add_argument("--preset", default="asp")
    p.add_argument("--dataset", default="mnist1d")
    p.add_argument("--max-updates", type=int, default=100)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--ray-cpus", type=int, default=2)
    args = p.parse_args(argv)

    import ray

    from hermes.common.config import build_config
    from hermes.sim.links import transfer_seconds
    from hermes.sim.populations import build_population
    from hermes.sim.run import Simulation, deterministic_view

    ray.init(num_cpus=args.ray_cpus, include_dashboard=False, log_to_driver=False)
    config = build_config(args.preset, dataset=args.dataset, seed=0, max_updates=args.max_updates)
    profiles = build_population(args.population, args.devices, 0)
    walls: dict[str, list[float]] = {"here": [], "ray": []}
    views = []
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for where in ("here", "ray"):
                sim = Simulation(config, profiles, out=Path(tmp) / f"{where}-{i}", transfer=transfer_seconds,
                                 population=args.population, ray="auto" if where == "ray" else None)
                t0 = time.perf_counter()
                summary = sim.run()
                walls[where].append(time.perf_counter() - t0)
                views.append(deterministic_view(summary))
                print(f"{where:>4} #{i}: {walls[where][-1]:.1f} s wall, {summary['virtual_seconds']:.1f} virtual s, "
                      f"{sum(w['device']['cycles'] for w in summary['workers'])} cycles", flush=True)
    load1 = os.getloadavg()
    ray.shutdown()
    here, on_ray = statistics.median(walls["here"]), statistics.median(walls["ray"])
    print(f"median wall: here {here:.1f} s, ray {on_ray:.1f} s, ray/here {on_ray / here:.2f}; "
          f"load average {load0[0]:.1f} before, {load1[0]:.1f} after; "
          f"summaries equal: {all(v == views[0] for v in views)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
