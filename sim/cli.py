"""``hermes-sim``: a run of the real engine and policies on a virtual clock, with simulated devices.

The testbed's task, data, config and link flags (``--task``, ``--dataset``,
``--model``, ``--set``, ``--config``, ``--target``, ``--target-accuracy``,
``--link``), a population of devices instead of agent processes
(``--devices N --population hl8|table2|generated|FILE``), and the testbed's
outputs in ``--out`` (``summary.json``, ``events.jsonl``): times in virtual
seconds, the wall time the simulation took beside them.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from pathlib import Path
from typing import Any

from hermes.common.cli_env import HermesParser

log = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    p = HermesParser(prog="hermes-sim", description=__doc__.split("\n\n")[0], version=True,
                     env_prefix="HERMES_SIM_")
    p.add_argument("--devices", type=int, default=None, metavar="N",
                   help="number of devices (default: the population's own: 4 for hl*, 12 for table2, the trace's)")
    p.add_argument("--population", default="hl8", metavar="hl1|hl2|hl4|hl8|table2|generated|FILE",
                   help="the testbed's HL profiles, Hermes Table II's families, a generated population "
                        "(generated[:KEY=VALUE,...]) or a FedScale trace file (default hl8)")
    p.add_argument("--preset", default=None, help="policy preset (default: the server's default)")
    p.add_argument("--seed", type=int, default=0, help="the run's seed: the same seed gives the same summary")
    p.add_argument("--out", default=None, help="output directory (default runs/sim/<UTC time>-<preset>); an "
                                               "earlier run's results there are never overwritten")
    p.add_argument("--task", default=None, metavar="REF",
                   help="the task: MODULE:ATTR, path/to/file.py:ATTR or an installed task name "
                        "(default builtin: --model on --dataset)")
    p.add_argument("--dataset", default="digits", help="digits (default), mnist1d, synthetic, mnist, cifar10")
    p.add_argument("--model", default=None, help="cnn, alexnet, resnet18, mlp (default: the config's)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="run-config override, repeatable")
    p.add_argument("--config", help="JSON or TOML file of run-config overrides")
    p.add_argument("--split", default="shards", metavar="shards|iid|dirichlet:ALPHA",
                   help="which samples each device holds: the server's shards, dealt to whoever asks (default, "
                        "as the testbed), an IID split of the train set, or a non-IID one (Dirichlet alpha per "
                        "device, Hsu et al. 2019); the server's allocator sizes the cycles either way")
    p.add_argument("--target", default=None, metavar="METRIC=VALUE", help="stop once an evaluation reaches this")
    p.add_argument("--target-accuracy", type=float, default=None, help="stop once test accuracy reaches this")
    p.add_argument("--max-seconds", type=float, default=3600.0,
                   help="virtual seconds after which the run stops (default 3600)")
    p.add_argument("--link", default=None, metavar="NAME",
                   help="every device's link: lan, wifi, lte, constrained or custom:UP/DOWN/RTT (the testbed's "
                        "names); default: the population's own")
    p.add_argument("--server-link", type=float, default=1000.0, metavar="MBPS",
                   help="the server's own link, each way, shared by every device (default 1000; inf: unlimited)")
    p.add_argument("--framing", choices=("tcp", "none"), default="none",
                   help="what a link's rate carries: tcp, the messages' TCP segments with their 66 bytes of "
                        "Ethernet/IP/TCP headers each (what the testbed's shaped links meter), or none, the "
                        "messages alone")
    p.add_argument("--device-link", type=device_link, default=0.0, metavar="per-message|queue[:SHARE]",
                   help="a device's link: each message with the whole link to itself (per-message, default), or one "
                        "queue a direction where a message waits for SHARE (0-1, default 1: first come first "
                        "served) of the bytes queued before it (the testbed's lte link: about 0.65)")
    p.add_argument("--server-cost", choices=("calibrated", "measured", "none"), default="calibrated",
                   help="what engine operations cost the server's CPU: the calibrated model (default, "
                        "deterministic), this process's measured CPU time (not deterministic), or nothing")
    p.add_argument("--heartbeat-interval", type=float, default=2.0, help="device heartbeat period (default 2)")
    p.add_argument("--heartbeat-timeout", type=float, default=10.0,
                   help="silence after which the server marks a device lost (default 10)")
    p.add_argument("--alone", action="store_true",
                   help="the baseline: the population's fastest device trains alone with all the data, always "
                        "online (time to target against a distributed run's)")
    p.add_argument("--ray", default=None, metavar="auto|ADDRESS",
                   help="train the devices' cycles on a Ray cluster, with the same summary as without it: auto "
                        "(the cluster running on this machine, else a local one for this run) or the cluster's "
                        "address (the optional extra: pip install hermes-edge[ray])")
    p.add_argument("--homogeneous", action="store_true",
                   help="every device at the population's mean FLOP/s: the ideal cluster of the same total compute")
    p.add_argument("--jitter", type=float, default=0.0, metavar="SIGMA",
                   help="per-cycle compute-time noise, log-normal with this sigma (default 0: none)")
    p.add_argument("--host", default="none", metavar="none|testbed[:KEY=VALUE,...]",
                   help="the testbed machine's shared cores: the server's and the devices' CPU work by processor "
                        "sharing of `cores` (2) with `background` other runnable processes (default none: every "
                        "device and the server on their own; sim/host.py, docs/simulation.md)")
    p.add_argument("--charge-model", default=None, metavar="NAME:CxHxW",
                   help="charge the compute of the model zoo's NAME on inputs of CxHxW (e.g. cnn:1x28x28, the "
                        "Hermes paper's MNIST CNN size) on the virtual clock while the run's own model trains for "
                        "real (default: the run's own model's FLOPs)")
    p.add_argument("--quiet", action="store_true", help="no summary table at the end")
    return p


def device_link(text: str) -> float:
    """``--device-link``: per-message (0) or queue[:SHARE], the share of a device's backlog a message waits for."""
    name, _, share = text.partition(":")
    if name == "per-message" and not share:
        return 0.0
    if name == "queue":
        try:
            value = float(share) if share else 1.0
        except ValueError:
            value = -1.0
        if 0.0 < value <= 1.0:
            return value
    raise argparse.ArgumentTypeError(f"{text!r}: per-message, queue or queue:SHARE with SHARE in (0, 1]")


def config_from(args: argparse.Namespace) -> Any:
    """The run config, as hermes-server builds it: the preset, then --config, then --set and the flags."""
    from hermes.common.config import DEFAULT_PRESET, build_config, load_config_file
    from hermes.server.settings import parse_set

    overrides: dict[str, Any] = {}
    if args.config:
        overrides.update(load_config_file(args.config))
    overrides.update(parse_set(args.set))
    for key in ("dataset", "model", "task", "target", "target_accuracy", "max_seconds", "seed"):
        value = getattr(args, key)
        if value is not None:
            overrides[key] = value
    return build_config(args.preset or overrides.pop("preset", None) or DEFAULT_PRESET, **overrides)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.devices is not None and args.devices < 1:
        print("hermes-sim: --devices must be >= 1", file=sys.stderr)
        return 2
    if args.ray is not None:
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            print("hermes-sim: --ray needs Ray: pip install 'hermes-edge[ray]'", file=sys.stderr)
            return 2
    from pydantic import ValidationError

    from hermes.common.config import ConfigError
    from hermes.common.messages import describe
    from hermes.common.task import TaskError
    from hermes.deploy.testbed_summary import format_summary
    from hermes.server.outdir import OutDirError, default_out_dir
    from hermes.sim.host import HostError, on_host, parse_host
    from hermes.sim.links import ServerLink, framed_transfer_seconds, transfer_seconds
    from hermes.sim.populations import PopulationError, build_population
    from hermes.sim.run import SimError, Simulation
    from hermes.sim.server_cost import by_name

    try:
        config = config_from(args)
    except ValidationError as exc:
        print(f"hermes-sim: {describe(exc)}", file=sys.stderr)
        return 2
    except (ConfigError, ValueError) as exc:
        print(f"hermes-sim: {exc}", file=sys.stderr)
        return 2
    try:
        profiles = build_population(args.population, args.devices, args.seed, link=args.link)
    except PopulationError as exc:
        print(f"hermes-sim: --population: {exc}", file=sys.stderr)
        return 2
    try:
        host = parse_host(args.host)
    except HostError as exc:
        print(f"hermes-sim: {exc}", file=sys.stderr)
        return 2
    if host is not None:
        profiles = on_host(profiles, args.population, host)
    if args.homogeneous:
        from hermes.sim.reference import homogeneous

        profiles = homogeneous(profiles)
    out = Path(args.out) if args.out else default_out_dir(config.preset, root="runs/sim")
    framed = args.framing == "tcp"
    link = None if math.isinf(args.server_link) else ServerLink(args.server_link, args.server_link, framed=framed)
    try:
        sim = Simulation(config, profiles, out=out, transfer=framed_transfer_seconds if framed else transfer_seconds,
                         server_link=link,
                         cost=by_name(args.server_cost), population=args.population, link=args.link,
                         heartbeat_interval=args.heartbeat_interval, heartbeat_timeout=args.heartbeat_timeout,
                         split=args.split, ray=args.ray, alone=args.alone, jitter=args.jitter,
                         host=host, charge_model=args.charge_model, backlog_share=args.device_link)
        summary = sim.run()
    except (SimError, OutDirError, TaskError) as exc:
        print(f"hermes-sim: {exc}", file=sys.stderr)
        return 2
    if not args.quiet:
        if len(profiles) <= 32:  # the testbed's table, a line per device
            print(format_summary(summary, out))
        print(f"   outcome {summary['outcome']}: target {'reached in ' + str(summary['seconds_to_target']) + ' virtual s' if summary['reached_target'] else 'not reached'}; "
              f"final accuracy {summary['final_accuracy']}; messages {summary['messages_total']}; summary {out / 'summary.json'}")
        print(f"   simulated {summary['virtual_seconds']:.1f} virtual seconds of {summary['devices']} devices "
              f"in {summary['wall_seconds']:.1f}s of wall time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
