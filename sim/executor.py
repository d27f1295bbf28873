"""Where the simulated devices' training runs: in this process (``LocalExecutor``) or on a Ray cluster (``RayExecutor``).

A device's cycle is handed to the executor when it starts in virtual time
(``submit``) and its result taken when it ends (``result``); everything
between is virtual time, so on Ray the cycles that overlap in virtual time
train in parallel while the event loop moves on, and the loop waits (in wall
time only) when it reaches a cycle's end before the cluster has finished it.

A cycle is pure: its inputs are the weights it starts from, the optimizer's
state, the device's shuffling stream (the numpy generator's state), the
proximal anchor when the run has one, the samples and the server's lr and
batch; its outputs the weights, state and stream after it. The same inputs
give the same bits in this process and in a Ray worker (one torch thread
each, the same trainer code), so a run gives the same summary either way.

Across processes only numpy arrays and plain dicts travel (Ray moves the
arrays zero-copy through its object store); the task itself is handed to Ray
once (its own serialiser, cloudpickle), stripped of its data: a worker needs
its model, loss, optimizer and hooks, never its samples. Ray is imported only
here, only when ``RayExecutor`` is built: the rest of the simulator runs
without it installed. A remote cluster's workers import ``hermes.sim.executor``
themselves: they need this package installed, and the same torch build on the
same kind of CPU for the same bits.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import uuid
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from hermes.client.trainer import CycleResult, LocalTrainer
from hermes.common.config import RunConfig
from hermes.common.task import Task
from hermes.common.tensors import ModelSpec, build_checked, load_flat

log = logging.getLogger(__name__)

__all__ = ["CycleInputs", "CycleOutputs", "Executor", "LocalExecutor", "RayExecutor", "RayMissing",
           "build_trainer", "run_cycle", "sim_precision"]

# The optimizer's state by parameter position (the optimizer keys it by Parameter object, which
# neither another trainer nor another process shares): {index: {name: tensor or number}}.
OptState = dict[int, dict[str, Any]]


class RayMissing(RuntimeError):
    """--ray without Ray installed, or a cluster that cannot be reached (one line)."""


@dataclass
class CycleInputs:
    weights: torch.Tensor  # flat fp32: where the cycle starts
    opt_state: OptState | None
    rng_state: dict[str, Any]  # the device's numpy generator (bit_generator.state)
    global_steps: int  # the trainer's step count (a task's train_step hook reads it)
    anchor: torch.Tensor | None  # FedAsync's x_tau: the model the device last loaded (proximal runs only)
    x: torch.Tensor
    y: torch.Tensor
    lr: float
    batch_size: int
    accumulation: int


@dataclass
class CycleOutputs:
    weights: torch.Tensor
    opt_state: OptState | None
    rng_state: dict[str, Any]
    global_steps: int
    result: CycleResult


class Executor(Protocol):
    def submit(self, inputs: CycleInputs) -> Any: ...

    def result(self, pending: Any) -> CycleOutputs: ...

    def close(self) -> None: ...


def sim_precision(config: RunConfig) -> str:
    """The precision simulated devices train in: the run config's when it forces one, fp32 for ``auto``.

    An agent resolves ``auto`` by timing its own device (client/precision.py); a simulated device has no
    hardware to time, and a measurement here would make the result depend on the machine running the
    simulation. fp32 is the deviation (docs/simulation.md's table); ``--set precision=bf16`` trains as agents that chose bf16
    do (this machine's: bf16 2.50 ms a step against fp32 6.55, 2026-11-28), and changes the numerics, not the
    virtual time (a device's compute time comes from its profile).
    """
    return "fp32" if config.precision == "auto" else config.precision


def build_trainer(task: Task, config: RunConfig, spec: ModelSpec) -> LocalTrainer:
    """The agent's trainer for this task and run config (client.session.Job.create's, on the CPU)."""
    return LocalTrainer(build_checked(task.model, spec), lr=config.lr, momentum=config.momentum,
                        weight_decay=config.weight_decay, device=torch.device("cpu"), precision=sim_precision(config),
                        seed=config.seed, loss=task.loss, optimizer=task.optimizer,
                        reset_jump=config.optimizer_reset_jump, proximal_rho=config.proximal_rho(),
                        train_step=task.train_step, transform=task.transform)


def state_of(trainer: LocalTrainer) -> OptState | None:
    """The optimizer's state by parameter position; None when it keeps none (plain SGD)."""
    state = trainer.optimizer.state
    if not state:
        return None
    params = [p for g in trainer.optimizer.param_groups for p in g["params"]]
    return {i: state[p] for i, p in enumerate(params) if p in state}


def load_state(trainer: LocalTrainer, opt_state: OptState | None) -> None:
    state: defaultdict[Any, Any] = defaultdict(dict)
    if opt_state:
        params = [p for g in trainer.optimizer.param_groups for p in g["params"]]
        for i, s in opt_state.items():
            state[params[i]] = s
    trainer.optimizer.state = state


def run_cycle(trainer: LocalTrainer, inputs: CycleInputs) -> CycleOutputs:
    """One cycle on ``trainer`` from exactly these inputs (the trainer keeps nothing of it that matters)."""
    if inputs.anchor is not None:
        # LocalTrainer.load sets the proximal anchor to what it loads (the agent's pulled model).
        load_state(trainer, None)
        trainer.load(inputs.anchor)
    load_flat(trainer.model, inputs.weights)
    load_state(trainer, inputs.opt_state)
    rng = np.random.default_rng()
    rng.bit_generator.state = inputs.rng_state
    trainer.rng = rng
    trainer.global_steps = inputs.global_steps
    trainer.set_lr(inputs.lr)
    result = trainer.train_cycle(inputs.x, inputs.y, inputs.batch_size, inputs.accumulation)
    return CycleOutputs(weights=trainer.flat(), opt_state=state_of(trainer), rng_state=dict(rng.bit_generator.state),
                        global_steps=trainer.global_steps, result=result)


class LocalExecutor:
    """Every cycle in this process, on one trainer, at once (the result is ready when submitted)."""

    def __init__(self, trainer: LocalTrainer) -> None:
        self.trainer = trainer

    def submit(self, inputs: CycleInputs) -> CycleOutputs:
        return run_cycle(self.trainer, inputs)

    def result(self, pending: CycleOutputs) -> CycleOutputs:
        return pending

    def close(self) -> None:
        pass


# ---- Ray ------------------------------------------------------------------------------------

def _plain_state(opt_state: OptState | None) -> dict[int, dict[str, Any]] | None:
    if opt_state is None:
        return None
    return {i: {k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in s.items()}
            for i, s in opt_state.items()}


def _tensor(a: Any) -> Any:
    # Arrays from Ray's object store are read-only views: copy, the trainer writes into its state.
    return torch.from_numpy(np.array(a)) if isinstance(a, np.ndarray) else a


def _to_plain(inputs: CycleInputs) -> dict[str, Any]:
    return {"weights": inputs.weights.numpy(), "opt_state": _plain_state(inputs.opt_state),
            "rng_state": inputs.rng_state, "global_steps": inputs.global_steps,
            "anchor": None if inputs.anchor is None else inputs.anchor.numpy(),
            "x": inputs.x.numpy(), "y": inputs.y.numpy(), "lr": inputs.lr, "batch_size": inputs.batch_size,
            "accumulation": inputs.accumulation}


def _from_plain_inputs(d: dict[str, Any]) -> CycleInputs:
    state = None if d["opt_state"] is None else {int(i): {k: _tensor(v) for k, v in s.items()}
                                                 for i, s in d["opt_state"].items()}
    return CycleInputs(weights=_tensor(d["weights"]), opt_state=state, rng_state=d["rng_state"],
                       global_steps=d["global_steps"], anchor=None if d["anchor"] is None else _tensor(d["anchor"]),
                       x=_tensor(d["x"]), y=_tensor(d["y"]), lr=d["lr"], batch_size=d["batch_size"],
                       accumulation=d["accumulation"])


def _outputs_plain(out: CycleOutputs) -> dict[str, Any]:
    r = out.result
    return {"weights": out.weights.numpy(), "opt_state": _plain_state(out.opt_state), "rng_state": out.rng_state,
            "global_steps": out.global_steps,
            "result": {"samples": r.samples, "steps": r.steps, "loss": r.loss, "compute_seconds": r.compute_seconds}}


def _outputs_from_plain(d: dict[str, Any]) -> CycleOutputs:
    state = None if d["opt_state"] is None else {int(i): {k: _tensor(v) for k, v in s.items()}
                                                 for i, s in d["opt_state"].items()}
    return CycleOutputs(weights=_tensor(d["weights"]), opt_state=state, rng_state=d["rng_state"],
                        global_steps=d["global_steps"], result=CycleResult(**d["result"]))


# A Ray worker's trainers, one per run it serves (built on the run's first cycle in that worker).
_TRAINERS: dict[str, LocalTrainer] = {}


def _remote_cycle(context: dict[str, Any], inputs: dict[str, Any]) -> dict[str, Any]:
    """A cycle in a Ray worker: plain dicts and numpy arrays in and out."""
    trainer = _TRAINERS.get(context["run"])
    if trainer is None:
        # The same sums in the same order as the simulating process (it trains with one thread too).
        torch.set_num_threads(1)
        config = RunConfig.model_validate(context["config"])
        spec = ModelSpec.from_dict(context["spec"])
        _TRAINERS.clear()  # one run at a time per worker: an earlier run's trainer is not needed any more
        trainer = _TRAINERS[context["run"]] = build_trainer(context["task"], config, spec)
    return _outputs_plain(run_cycle(trainer, _from_plain_inputs(inputs)))


class RayExecutor:
    """Cycles as Ray tasks: submitted when they start in virtual time, awaited when they end."""

    def __init__(self, address: str, *, task: Task, config: RunConfig, spec: ModelSpec,
                 init_kwargs: dict[str, Any] | None = None) -> None:
        if importlib.util.find_spec("ray") is None:
            raise RayMissing("--ray needs Ray: pip install 'hermes-edge[ray]'")
        import ray

        self.ray = ray
        self.started = False
        if not ray.is_initialized():
            kwargs = {"include_dashboard": False, "log_to_driver": False, **(init_kwargs or {})}
            # "auto": Ray's default, the cluster started on this machine (ray start) if any, else a new local one.
            try:
                ray.init(address=None if address == "auto" else address, **kwargs)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise RayMissing(f"--ray {address}: {exc}") from None
            self.started = True
        # The worker needs the task's code, never its data (the split's local_data holds the train set).
        bare = dataclasses.replace(task, train_data=None, test_data=None, local_data=None, local_eval_data=None,
                                   example=None)
        self.context = ray.put({"run": uuid.uuid4().hex, "config": config.model_dump(mode="json"),
                                "spec": spec.to_dict(), "task": bare})
        self.remote = ray.remote(num_cpus=1)(_remote_cycle)
        self.submitted = 0

    def submit(self, inputs: CycleInputs) -> Any:
        self.submitted += 1
        return self.remote.remote(self.context, _to_plain(inputs))

    def result(self, pending: Any) -> CycleOutputs:
        return _outputs_from_plain(self.ray.get(pending))

    def close(self) -> None:
        if self.started:
            self.ray.shutdown()
            self.started = False
