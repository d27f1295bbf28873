"""One simulated run: the engine, the devices, the virtual clock, and the testbed's summary at the end.

``Simulation`` builds the real ``Engine`` (its clock the virtual one, its
data and model from the run config and task as ``hermes-server`` builds
them), one ``SimDevice`` per profile, and runs them on a ``VirtualLoop``
until the engine stops (target, budget) or no device is left. The outputs
are the testbed's: ``summary.json`` (``deploy.testbed_summary.build_summary``,
with virtual seconds where the testbed has wall-clock ones, and the wall time
the simulation itself took beside them), ``events.jsonl`` (the engine's own
event log, stamped with virtual time) and the server's summary and models.

Same seed, same result: the data, the model, every device's shuffling and
the order of events are seeded or sequential; the only inputs from the
machine are wall-clock fields (``wall_seconds``, an evaluation's
``seconds``), listed in ``WALL_FIELDS``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from hermes.client.session import Job, pull_encoding
from hermes.common import readable_json
from hermes.common.config import RunConfig
from hermes.common.messages import KafkaRanges
from hermes.common.task import Task
from hermes.common.task_registry import batch_of, example_batch, resolve_task
from hermes.common.tensors import build_checked, load_flat
from hermes.common.wire import dtype_from_name
from hermes.deploy.testbed_summary import build_summary
from hermes.server.engine import Engine
from hermes.server.engine.local import local_data_refusal
from hermes.server.events import EventLog
from hermes.server.metrics import ServerMetrics
from hermes.server.outdir import prepare_out_dir
from hermes.server.settings import DEFAULT_MAX_MESSAGE_BYTES
from hermes.server.shardstore import load_splits
from hermes.sim import memory
from hermes.sim.data import Split, SplitError, parse_split, plan_data
from hermes.sim.device import DeviceDataError, SimDevice, VersionStore
from hermes.sim.engine_driver import Driver, ServerCostModel, ServerLinkModel, Transfer
from hermes.sim.events import VirtualClock, run_virtual
from hermes.sim.executor import Executor, LocalExecutor, RayExecutor, RayMissing, build_trainer
from hermes.sim.host import Host, HostSpec
from hermes.sim.reference import fastest_alone
from hermes.sim.server_cost import MeasuredCost, ZeroCost, probe_seconds

log = logging.getLogger(__name__)

__all__ = ["WALL_FIELDS", "SimError", "Simulation", "deterministic_view"]

# Fields of summary.json measured on this machine's clock, not the virtual one.
WALL_FIELDS = ("wall_seconds", "sim")
# Virtual seconds the devices get after the stop to send their last report and leave (the
# server's EXIT_GRACE_SECONDS); a device still busy then is cut off.
EXIT_GRACE_S = 15.0
# Without a max_seconds budget a run whose devices never reach the target would never end.
DEFAULT_MAX_VIRTUAL_S = 3_600.0
# Samples the FLOP count is taken on (per-sample FLOPs of a training step and of an evaluation).
FLOP_BATCH = 16


class SimError(Exception):
    """A simulation that cannot run as asked (one line)."""


def flops_per_sample(task: Task, spec: Any, train: Any) -> tuple[float, float]:
    """FLOPs of one sample's training step (forward and backward) and of its forward pass alone.

    Counted by torch's FlopCounterMode on a batch of the training data: deterministic, the
    device's compute time is this over its FLOP/s.
    """
    model = build_checked(task.model, spec)
    if len(train):
        x, y = batch_of(train, list(range(min(FLOP_BATCH, len(train)))))
    else:  # the devices hold the data (Task.local_data): the task's example or test samples, shaped alike
        x, y = example_batch(task, FLOP_BATCH)
    n = len(y)
    with FlopCounterMode(display=False) as fwd:
        with torch.no_grad():
            model(x)
    with FlopCounterMode(display=False) as step:
        task.loss(model(x), y).backward()
    return max(1.0, step.get_total_flops() / n), max(1.0, fwd.get_total_flops() / n)


def charged_flops(spec: str) -> tuple[float, float]:
    """``NAME:CxHxW`` (e.g. ``cnn:1x28x28``): FLOPs of one sample's training step and forward pass of the model
    zoo's ``NAME`` built for that input (10 classes), counted as :func:`flops_per_sample` counts them.

    ``hermes-sim --charge-model`` charges these on the virtual clock while the run's own model trains for
    real: the compute of another model (the paper's) with the statistics of ours. Stated wherever it is used.
    """
    from hermes.common.models import build_model

    name, _, shape_text = spec.partition(":")
    with torch.random.fork_rng():  # the run's own random stream stays as the seed left it
        try:
            shape = tuple(int(d) for d in shape_text.lower().split("x"))
            model = build_model(name, input_shape=shape, num_classes=10)
        except (ValueError, TypeError) as exc:
            raise SimError(f"--charge-model {spec!r}: {exc} (expected NAME:CxHxW, e.g. cnn:1x28x28)") from None
        x, y = torch.randn(FLOP_BATCH, *shape), torch.randint(0, 10, (FLOP_BATCH,))
        with FlopCounterMode(display=False) as fwd:
            with torch.no_grad():
                model(x)
        with FlopCounterMode(display=False) as step:
            torch.nn.functional.cross_entropy(model(x), y).backward()
    return step.get_total_flops() / FLOP_BATCH, fwd.get_total_flops() / FLOP_BATCH


@dataclass
class _Proc:
    """A device as build_summary reads an agent process (name, info, exit code, log)."""

    name: str
    info: dict[str, Any]
    popen: Any
    log_path: Path


class Simulation:
    def __init__(self, config: RunConfig, profiles: Sequence[Any], *, out: str | Path, task: Task | None = None,
                 transfer: Transfer, server_link: ServerLinkModel | None = None,
                 cost: ServerCostModel | None = None, population: str = "", link: str | None = None,
                 heartbeat_interval: float = 2.0, heartbeat_timeout: float = 10.0,
                 executor: Executor | None = None, split: str | Split | None = None, ray: str | None = None,
                 alone: bool = False, jitter: float = 0.0, host: HostSpec | None = None,
                 charge_model: str | None = None, backlog_share: float = 0.0) -> None:
        if alone:  # the population's fastest device by itself, with all the data (sim/reference.py)
            profiles = fastest_alone(profiles)
        if not profiles:
            raise SimError("no devices to simulate")
        if config.topology != "ps":
            raise SimError(f"topology {config.topology!r}: the simulator runs the parameter-server topology only")
        if config.max_seconds is None:
            config = config.model_copy(update={"max_seconds": DEFAULT_MAX_VIRTUAL_S})
        self.config = config
        self.profiles = list(profiles)
        self.out = Path(out)
        if (self.out / "summary.json").exists():
            raise SimError(f"{self.out} holds an earlier run's summary.json: give another --out")
        prepare_out_dir(self.out, resume=False, overwrite=False)
        self.population, self.link = population, link
        self.alone = alone
        self.transfer = transfer
        self.heartbeat_interval = heartbeat_interval
        self.clock = VirtualClock(start=0.0)
        torch.manual_seed(config.seed)
        resolved = task if task is not None else resolve_task(config.task, config)
        # Shards from the server's queue, or device-local data (a split of the train set, the task's own).
        try:
            self.data = plan_data(resolved, parse_split(split), [p.device_id for p in self.profiles],
                                  seed=config.seed, load=lambda: load_splits(config, resolved))
        except SplitError as exc:
            raise SimError(str(exc)) from None
        self.task = self.data.task
        if self.task.local_data is not None and (why := local_data_refusal(config)) is not None:
            raise SimError(f"preset {config.preset!r} cannot train on device-local data (--split "
                           f"{self.data.record['split']}): {why}")
        self.engine = Engine(config, metrics=ServerMetrics(), events=EventLog(self.out / "events.jsonl", clock=self.clock),
                             max_workers=max(len(self.profiles), 1), max_message_bytes=DEFAULT_MAX_MESSAGE_BYTES,
                             out_dir=str(self.out), task=self.task, clock=self.clock, splits=self.data.splits)
        # The testbed machine's shared cores (sim/host.py), or None: every device and the server on their own.
        self.host = Host(host) if host is not None else None
        if self.host is not None and isinstance(cost, MeasuredCost):
            raise SimError("--host takes the calibrated (or no) server cost, not the measured one")
        self.driver = Driver(self.engine, self.clock, transfer=transfer, server_link=server_link,
                             cost=cost if cost is not None else ZeroCost(), heartbeat_timeout=heartbeat_timeout,
                             backlog_share=backlog_share,
                             host=self.host)
        self.combine = bool(config.combine_messages)
        # The codecs as an agent applies them (client.session): compression.push per device (sim/device.py);
        # compression.pull fp16/bf16 travel as the pull dtype, int8 as a codec the server quantises.
        self.push_codec_name = config.compression.push
        self.pull_dtype, self.pull_codec = pull_encoding(config)
        spec = self.engine.spec
        # One trainer, every device's in turn (device.py says what is swapped in and out), built as an agent's.
        self.trainer = build_trainer(self.task, config, spec)
        load_flat(self.trainer.model, self.engine.state.snapshot()[1])
        # FedAsync's proximal term (Xie et al. 2019 Sec. 4): each cycle is anchored at the device's pulled model.
        self.proximal = bool(self.trainer.proximal_rho)
        self.precision = self.trainer.precision  # sim_precision(config): auto trains in fp32
        self.job = Job(spec=spec, config=config, precision=self.precision,
                       wire_dtype=dtype_from_name(config.wire_dtype),
                       trainer=self.trainer, gate=None, from_baseline=config.pushes_from_baseline(),
                       validation_shards=[], data_source=KafkaRanges(), task=self.task)
        self.train_flops, self.eval_flops = flops_per_sample(self.task, spec, self.engine.train)
        # --charge-model: another model's compute on the virtual clock (messages keep our model's real sizes).
        self.charge_model = charge_model
        if charge_model:
            self.train_flops, self.eval_flops = charged_flops(charge_model)
        self.driver.push_extra_seconds = probe_seconds(
            self.driver.cost, scores=self.engine.policies.aggregation.probe is not None,
            samples=config.loss.eval_samples, forward_flops=self.eval_flops)
        self.versions = VersionStore()
        self.validation_cache: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]] = {}
        # Where the cycles train: here, or on a Ray cluster (sim.executor; the same summary either way).
        if executor is None and ray is not None:
            try:
                executor = RayExecutor(ray, task=self.task, config=config, spec=spec)
            except RayMissing as exc:
                raise SimError(str(exc)) from None
        self.executor: Executor = executor if executor is not None else LocalExecutor(self.trainer)
        self._sessions = 0
        self.devices = [SimDevice(p, self) for p in self.profiles]
        for i, d in enumerate(self.devices):
            d.index = i
        self.wall_seconds = 0.0
        # What the devices held, by state, at the count with the most (sim.memory).
        self.device_memory: dict[str, Any] = {}
        # Per-cycle compute-time noise (log-normal, median 1, sigma ``jitter``; 0: none): a testbed agent's
        # cycles vary by sigma 0.2-0.5 on a loaded machine (docs/simulation.md#calibration-against-the-testbed-issue-27),
        # and the allocators react to it. Seeded, drawn in event order: deterministic.
        if jitter < 0:
            raise SimError(f"jitter must be >= 0, got {jitter}")
        self.jitter = jitter
        self._jitter_rng = np.random.default_rng(config.seed + 0x5EED)

    @property
    def over(self) -> bool:
        return self.engine.stopping

    def next_session(self) -> int:
        self._sessions += 1
        return self._sessions

    def compute_seconds(self, samples: int, flops: float) -> float:
        noise = float(np.exp(self.jitter * self._jitter_rng.standard_normal())) if self.jitter else 1.0
        return samples * self.train_flops / flops * noise

    def eval_seconds(self, samples: int, flops: float) -> float:
        return samples * self.eval_flops / flops

    async def _main(self) -> dict[str, Any]:
        engine, driver = self.engine, self.driver
        engine.start()
        # The evaluator's thread is stopped before its first evaluation: the simulation evaluates
        # in virtual time (Driver.evaluations), the thread would in wall-clock time.
        engine.evaluator.stop()
        driver.monitor.start()
        evaluations = asyncio.ensure_future(driver.evaluations())
        counting = asyncio.ensure_future(memory.sampler(self, self.device_memory))
        tasks = [asyncio.ensure_future(d.run()) for d in self.devices]
        everyone = asyncio.gather(*tasks)
        stopped = asyncio.ensure_future(driver.stopped.wait())
        await asyncio.wait(cast("set[asyncio.Future[Any]]", {stopped, everyone}), return_when=asyncio.FIRST_COMPLETED)
        memory.keep_larger(self.device_memory, memory.sample(self))  # the devices as the run stops
        if not engine.stopping:
            engine.request_stop("no device is left")
        left = [t for t in tasks if not t.done()]
        if left:
            await asyncio.wait(left, timeout=EXIT_GRACE_S)
        for t in tasks:
            t.cancel()
        await asyncio.gather(everyone, return_exceptions=True)
        stopped.cancel()
        evaluations.cancel()
        counting.cancel()
        await asyncio.gather(evaluations, stopped, counting, return_exceptions=True)
        await driver.monitor.stop()
        for t in tasks:
            if not t.cancelled() and t.exception() is not None:
                raise t.exception()  # type: ignore[misc]
        return engine.shutdown()

    def run(self) -> dict[str, Any]:
        threads = torch.get_num_threads()
        # One thread: the same sums in the same order on every machine (and the CPU is shared anyway).
        torch.set_num_threads(1)
        t0 = time.perf_counter()
        try:
            srv = run_virtual(self.clock, self._main)
        except DeviceDataError as exc:
            raise SimError(str(exc)) from None
        finally:
            torch.set_num_threads(threads)
            self.executor.close()
        self.wall_seconds = time.perf_counter() - t0
        summary = self.summary(srv)
        tmp = self.out / "summary.json.tmp"
        tmp.write_text(readable_json.dumps(summary))
        tmp.replace(self.out / "summary.json")
        return summary

    def summary(self, srv: dict[str, Any]) -> dict[str, Any]:
        c = self.config
        reached = self.engine.target_reached
        a = argparse.Namespace(preset=c.preset, profile=self.population, clients=len(self.devices), dataset=c.dataset,
                               model=c.model, speed_schedule="", pace=1.0, topology=c.topology,
                               target_accuracy=c.target_accuracy, target=c.target, kafka=None)
        procs = [_Proc(d.name, {"speed": d.profile.flops, "slowdown": 1.0, "cores": 1, "threads": 1},
                       SimpleNamespace(returncode=d.exit_code), self.out / "events.jsonl") for d in self.devices]
        links = {"mode": "simulated", "link": self.link, "agents": {
            d.name: {"name": f"{d.up_mbps:g}/{d.down_mbps:g} Mbit/s {d.rtt_s * 1000:g} ms"} for d in self.devices}}
        summary = build_summary(a, srv, outcome=self.engine.outcome, wall=self.wall_seconds,
                                reached_at=None if reached is None else reached.seconds, t0=0.0,
                                agents=cast("list[Any]", procs),
                                out=self.out, chaos_log=[], server_exit_code=0, kafka_bootstrap=None, links=links)
        for w, d in zip(summary["workers"], self.devices):
            w["family"] = getattr(d.profile, "family", None)
            w["flops"] = d.profile.flops
            # JSON has no NaN (last_loss before any cycle, or a diverged one's).
            w["device"] = {k: None if isinstance(v, float) and not math.isfinite(v) else v
                           for k, v in asdict(d.totals).items()}
            if d.name in self.data.held:
                w["data"] = self.data.held[d.name]
        summary["data"] = self.data.record
        summary["engine"] = "sim"
        summary["population"] = self.population
        summary["devices"] = len(self.devices)
        summary["alone"] = self.alone
        summary["virtual_seconds"] = round(self.clock.monotonic(), 6)
        summary["server_busy_seconds"] = round(self.driver.server_busy_seconds, 6)
        summary["flops_per_sample"] = {"train": self.train_flops, "evaluate": self.eval_flops,
                                       "charged_model": self.charge_model}
        summary["compute_jitter"] = self.jitter
        summary["link_model"] = {"transfer": getattr(self.transfer, "__name__", repr(self.transfer)),
                                 "device_link": (f"queue:{self.driver.backlog_share:g}" if self.driver.backlog_share
                                                 else "per-message")}
        summary["host"] = self.host.stats(self.clock.monotonic()) if self.host is not None else None
        # Model copies the devices held: versions (shared) at their peak, own weights at the end.
        summary["sim"] = {"peak_versions_held": self.versions.peak,
                          "own_weights_held_at_end": sum(d.local is not None for d in self.devices),
                          "optimizer_states_held_at_end": sum(d.opt_state is not None for d in self.devices),
                          "device_memory": self.device_memory}
        return summary


def deterministic_view(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary without what the machine's clock measured: equal for two runs of one seed."""
    out = {k: v for k, v in summary.items() if k not in WALL_FIELDS}
    out["accuracy_timeline"] = [{k: v for k, v in e.items() if k != "seconds"}
                                for e in summary.get("accuracy_timeline", [])]
    return out
