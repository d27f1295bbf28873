"""``hermes.simulate``: a run on the simulator (hermes.sim) from Python, with the ``Result`` of ``hermes.train``.

    import hermes
    result = hermes.simulate(task, devices=1000, population="generated", preset="fedbuff", seed=0,
                             target="accuracy=0.9")
    print(result.outcome, result.seconds, len(result.summary["workers"]))

The real engine and policies run on a virtual clock; ``Result.seconds`` is
virtual (time to the end of the run on the devices' clock), the wall time the
simulation took is ``Result.summary["wall_seconds"]``. ``hermes.train`` uses
it for more agents than the process-agent path runs (``PROCESS_AGENTS_MAX``).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from hermes.api import Result, _default_out, result_from
from hermes.common.task import Task

__all__ = ["simulate"]


def simulate(task: Task | str, *, devices: int | None = None, population: str = "hl8", preset: str | None = None,
             seed: int = 0, target: str | None = None, max_seconds: float | None = None,
             max_epochs: float | None = None, max_updates: int | None = None, out_dir: str | Path | None = None,
             config: dict[str, Any] | None = None, link: str | None = None, server_link_mbps: float = 1000.0,
             server_cost: str = "calibrated", slowdowns: list[float] | None = None) -> Result:
    """Simulate ``task`` on ``devices`` devices of ``population`` (hl1..hl8, table2, generated, a trace file).

    ``max_seconds`` is in virtual seconds (default 3600). ``slowdowns``: one factor per device,
    dividing its compute speed (as ``hermes.train``'s emulated agents are slowed down).
    """
    from hermes.common.config import DEFAULT_PRESET, build_config
    from hermes.common.task_registry import resolve_task
    from hermes.sim.cli import server_cost as cost_model
    from hermes.sim.links import ServerLink, transfer_seconds
    from hermes.sim.populations import build_population
    from hermes.sim.run import Simulation

    values = {"target": target, "max_seconds": max_seconds, "max_epochs": max_epochs, "max_updates": max_updates,
              "seed": seed, "task": None if isinstance(task, Task) else task}
    run_config = build_config(preset or DEFAULT_PRESET, **{**(config or {}),
                                                          **{k: v for k, v in values.items() if v is not None}})
    resolved = resolve_task(task, run_config)
    profiles = build_population(population, devices, seed, link=link)
    if slowdowns is not None:
        if len(slowdowns) != len(profiles):
            raise ValueError(f"slowdowns: {len(slowdowns)} factors for {len(profiles)} devices")
        profiles = [dataclasses.replace(p, flops=p.flops / s) for p, s in zip(profiles, slowdowns)]
    out = Path(out_dir) if out_dir is not None else _default_out(f"sim-{resolved.name or 'task'}")
    server_link = None if math.isinf(server_link_mbps) else ServerLink(server_link_mbps, server_link_mbps)
    sim = Simulation(run_config, profiles, out=out, task=resolved, transfer=transfer_seconds, server_link=server_link,
                     cost=cost_model(server_cost), population=population, link=link)
    summary = sim.run()
    return dataclasses.replace(result_from(out, {}), summary=summary)
