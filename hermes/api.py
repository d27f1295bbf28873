"""Train a task from Python: a parameter server and agents in this process.

    import hermes
    result = hermes.train(task, agents=4, preset="hermes", target="accuracy=0.9", max_seconds=120)
    print(result.stop_reason, result.metrics, result.model_path)

``hermes.Server`` runs the server (uvicorn in a background thread, the
same app ``hermes-server`` runs) and ``hermes.Agent`` one agent in a thread
of this process, so a Task defined in a notebook cell trains without an
import reference: the Task object itself is handed to both. Both are
context managers; leaving the ``with`` block stops the run, lets the agents
leave, writes the summary and the models, and joins every thread.

``hermes.simulate`` runs a task on the simulator instead (hermes.sim: the
real engine and policies on a virtual clock, devices from a population);
``Result.seconds`` are virtual seconds there, ``Result.summary`` is the
simulator's summary.json (``wall_seconds``: what the simulation took).

This module sits above ``hermes.server`` and ``hermes.client`` (like
``hermes.deploy``), never below them: ``hermes.common`` stays free of
sockets and threads.
"""

from __future__ import annotations

import json
import logging
import secrets
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hermes.callbacks import Callback, Dispatcher, ProgressLine
from hermes.common.task import Task

if TYPE_CHECKING:
    from hermes.client.agent import Agent as _ClientAgent
    from hermes.client.session import AgentStats

__all__ = ["Agent", "Callback", "Result", "RunError", "Server", "simulate", "train"]

log = logging.getLogger(__name__)

# Longest wait for uvicorn to bind and the lifespan to start the engine (the task's data is loaded there).
STARTUP_TIMEOUT_S = 120.0
# After the run stopped, the server waits up to 15 s for its agents to leave
# (server.app.EXIT_GRACE_SECONDS); this bounds the wait for the last files beyond that.
SHUTDOWN_TIMEOUT_S = 60.0
# The most agents hermes.train runs as threads of this process; more are simulated (hermes.simulate).
PROCESS_AGENTS_MAX = 16


class RunError(RuntimeError):
    """The server could not start, or did not finish its shutdown in time; the message says which."""


@dataclass(frozen=True)
class Result:
    """How a run ended: its last and best evaluations, why it stopped, and where the model is."""

    outcome: str  # target_reached, budget_reached, early_stopped or stopped
    stop_reason: str
    metrics: dict[str, float]  # the final evaluation's metrics, with "loss"
    best_metrics: dict[str, float] | None
    seconds: float
    updates: int
    out_dir: Path
    model_path: Path | None  # model-final.safetensors, else model-best.safetensors, else None
    best_model_path: Path | None
    agent_errors: dict[str, str] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def target_reached(self) -> bool:
        return self.outcome == "target_reached"


class Server:
    """A parameter server for ``task`` in a background thread of this process.

    ``task`` is a Task or a reference (``MODULE:ATTR``, ``FILE.py:ATTR``, an
    installed name). ``config`` holds any other run-config key (``lr``,
    ``batch_size``, ``eval_interval_seconds`` ...). A join token is made up
    for the run and handed to the ``hermes.Agent``s started with this server.

    ``callbacks`` (hermes.callbacks.Callback) hear the run's evaluations,
    model versions and stop. ``verbose`` 0: warnings only; 1: one progress
    line per evaluation on stdout; 2: the server's and agents' INFO log.
    Checkpoints go to ``out_dir/checkpoints``: ``resume=True`` continues the
    run found there, ``overwrite=True`` replaces another run's outputs.
    """

    def __init__(self, task: Task | str, *, preset: str | None = None, target: str | None = None,
                 max_seconds: float | None = None, max_epochs: float | None = None, max_updates: int | None = None,
                 out_dir: str | Path | None = None, config: dict[str, Any] | None = None,
                 host: str = "127.0.0.1", port: int = 0, join_token: str | None = None,
                 callbacks: Sequence[Callback] = (), verbose: int = 1, resume: bool = False,
                 overwrite: bool = False) -> None:
        from pydantic import ValidationError

        from hermes.common.task_registry import resolve_task
        from hermes.server.settings import ServerSettings

        name = task.name if isinstance(task, Task) else task
        if resume and out_dir is None:
            raise ValueError("resume=True needs out_dir=, the folder of the run to continue")
        self.out_dir = Path(out_dir) if out_dir is not None else _default_out(name)
        self.join_token = join_token or secrets.token_hex(32)
        fields: dict[str, Any] = {
            "preset": preset, "target": target, "max_seconds": max_seconds, "max_epochs": max_epochs,
            "max_updates": max_updates, "task": None if isinstance(task, Task) else task,
        }
        try:
            self.settings = ServerSettings(
                **{k: v for k, v in fields.items() if v is not None}, run=dict(config or {}),
                out_dir=str(self.out_dir), data_host=host, advertise_host=host, join_token=self.join_token,
                exit_when_done=True, checkpoint_dir=str(self.out_dir / "checkpoints"), resume=resume,
                overwrite=overwrite, log_level="info" if verbose >= 2 else "warning",
            )
        except ValidationError as exc:
            # One line naming each field, not pydantic's report (a ValueError, as before).
            raise ValueError("; ".join(_problem(e) for e in exc.errors())) from None
        self.verbose = verbose
        self.callbacks = [*callbacks, *([ProgressLine(sys.stdout)] if verbose == 1 else [])]
        self._dispatcher: Dispatcher | None = None
        self._quiet: _Quiet | None = None
        # Resolved once here, so the agents of this process get the very object the server trains.
        self.task: Task = resolve_task(task, self.settings.run_config())
        self.host, self.port = host, port
        self.url = ""
        self.data_address = ""
        self.agents: list[Agent] = []
        self._uvicorn: Any = None
        self._thread: threading.Thread | None = None
        self._result: Result | None = None

    # ---- lifecycle

    def start(self) -> Server:
        """Start uvicorn and wait until the engine runs (TaskError: the task failed its start-up check)."""
        import uvicorn

        from hermes.server.app import create_app
        from hermes.server.outdir import OutDirError

        if self._thread is not None:
            return self
        self._quiet = _Quiet(self.verbose)
        try:
            app = create_app(self.settings, task=self.task)
        except OutDirError as exc:
            self._quiet.restore()
            # The server's message names its command-line flags; here they are this call's arguments.
            text = str(exc).replace("--resume CHECKPOINT_DIR", "resume=True").replace("--overwrite", "overwrite=True")
            raise RunError(text.replace("--out", "out_dir")) from None
        except BaseException:
            self._quiet.restore()
            raise
        if self.callbacks:
            self._dispatcher = Dispatcher(self, self.callbacks)
            app.state.listeners = [self._dispatcher.listener]
        ready = threading.Event()

        class _Uvicorn(uvicorn.Server):
            async def startup(self, sockets: Any = None) -> None:
                await super().startup(sockets=sockets)
                ready.set()

        server = _Uvicorn(uvicorn.Config(app, host=self.host, port=self.port, log_level="warning",
                                         timeout_graceful_shutdown=10))
        # With exit_when_done the app ends the run's server itself, once the agents have left.
        app.state.exit_now = lambda: setattr(server, "should_exit", True)
        self._uvicorn = server
        def serve() -> None:
            try:
                server.run()
            except SystemExit:  # uvicorn's own exit on a failed start (a port in use): logged by uvicorn
                log.debug("uvicorn exited during start-up")

        self._thread = threading.Thread(target=serve, name="hermes-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not ready.wait(0.05):
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self._abandon_start()
        if not server.started:
            self._abandon_start()
        port = server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://{self.host}:{port}"
        self.data_address = app.state.data_plane_address
        log.info("hermes server for task %s at %s, writing to %s", self.task.name, self.url, self.out_dir)
        return self

    def _abandon_start(self) -> None:
        assert self._thread is not None
        self._uvicorn.should_exit = True
        self._thread.join(SHUTDOWN_TIMEOUT_S)
        # Never started: close() and wait() have nothing to wait for.
        self._thread = None
        if self._dispatcher is not None:
            self._dispatcher.close()
            self._dispatcher = None
        if self._quiet is not None:
            self._quiet.restore()
        raise RunError(f"the server for task {self.task.name} did not start (see the log above)")

    @property
    def engine(self) -> Any:
        """The running engine (for reading; it lives on the server thread's event loop)."""
        return None if self._uvicorn is None else getattr(self._uvicorn.config.app.state, "engine", None)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, reason: str = "stopped from Python") -> None:
        """Ask the run to stop (as POST /v1/stop); the agents hear it at their next exchange."""
        engine = self.engine
        if not self.running:
            return
        if engine is None:  # still starting: nothing to stop but the server itself
            self._uvicorn.should_exit = True
        else:
            engine.on_loop(engine.request_stop, reason)

    def wait(self, timeout: float | None = None) -> Result:
        """Wait for the run to end (target, budget or stop), then for the shutdown; return the result.

        Past ``timeout`` seconds the run is stopped. A run whose agents of this
        process have all ended (errors included) is stopped too: nobody is left to train.
        """
        if self._result is not None:
            return self._result
        if self._thread is None:
            raise RunError("the server was never started: call start() or use it in a with block")
        deadline = None if timeout is None else time.monotonic() + timeout
        stopped = False
        while self._thread.is_alive():
            self._thread.join(0.1)
            if stopped:
                continue
            if deadline is not None and time.monotonic() > deadline:
                self.stop(f"timeout of {timeout:g} s from Python")
                stopped = True
            elif self.agents and not any(a.running for a in self.agents):
                errors = "; ".join(f"{a.name}: {a.error}" for a in self.agents if a.error)
                self.stop(f"every agent ended{': ' + errors if errors else ''}")
                stopped = True
        for agent in self.agents:
            agent.join(SHUTDOWN_TIMEOUT_S)
        try:
            self._result = self._read_result()
        finally:
            if self._quiet is not None:
                self._quiet.restore()
        if self._dispatcher is not None:
            self._dispatcher.end(self._result)
        return self._result

    def close(self) -> Result | None:
        """Stop the run if it is still going and shut everything down; idempotent."""
        if self._thread is None:
            return None
        if self._result is None:
            self.stop()
            for agent in self.agents:
                agent.stop("the server is closing")
            try:
                return self.wait(timeout=SHUTDOWN_TIMEOUT_S)
            finally:
                if self._thread.is_alive():  # uvicorn ignored should_exit: stop waiting on it
                    self._uvicorn.force_exit = True
                    self._thread.join(SHUTDOWN_TIMEOUT_S)
        return self._result

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- agents and result

    def add_agents(self, count: int, *, slowdowns: list[float] | None = None, **options: Any) -> list[Agent]:
        """``count`` agents named worker-1 .. worker-N of this server, started; ``slowdowns`` one factor each."""
        if slowdowns is not None and len(slowdowns) != count:
            raise ValueError(f"slowdowns: {len(slowdowns)} factors for {count} agents")
        first = len(self.agents) + 1
        return [Agent(self, name=f"worker-{first + i}", slowdown=slowdowns[i] if slowdowns else 1.0, **options)
                for i in range(count)]

    def _read_result(self) -> Result:
        return result_from(self.out_dir, {a.name: a.error for a in self.agents if a.error})


def result_from(out_dir: Path, agent_errors: dict[str, str]) -> Result:
    """The Result of a run whose server wrote its summary and models to ``out_dir`` (a server, a simulation)."""
    path = out_dir / "server_summary.json"
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise RunError(f"the server wrote no summary to {path} ({exc}): see the log above") from None
    metrics = dict(summary.get("final_metrics") or {})
    if summary.get("final_loss") is not None:
        metrics.setdefault("loss", summary["final_loss"])
    final, best = out_dir / "model-final.safetensors", out_dir / "model-best.safetensors"
    best_path = best if best.is_file() else None
    return Result(
        outcome=summary.get("outcome", "stopped"), stop_reason=summary.get("stop_reason", ""),
        metrics=metrics, best_metrics=summary.get("best_metrics"),
        seconds=float(summary.get("elapsed_seconds", 0.0)), updates=int(summary.get("model_updates", 0)),
        out_dir=out_dir, model_path=final if final.is_file() else best_path, best_model_path=best_path,
        agent_errors=agent_errors, summary=summary,
    )


class Agent:
    """One agent training for ``server`` in a thread of this process; started at once unless ``start=False``.

    ``server`` is a :class:`Server` (its task object and join token are
    used) or a URL (then give ``task`` and ``join_token``). ``slowdown``
    emulates a device that many times slower, as ``hermes-client --slowdown``.
    """

    def __init__(self, server: Server | str, *, name: str = "worker-1", task: Task | str | None = None,
                 join_token: str | None = None, slowdown: float = 1.0, threads: int = 1, device: str = "cpu",
                 start: bool = True, **options: Any) -> None:
        from hermes.client.agent import Agent as ClientAgent
        from hermes.client.agent import AgentOptions

        if isinstance(server, Server):
            if not server.url:
                raise RunError("start the server before adding agents to it")
            url, task = server.url, task if task is not None else server.task
            join_token = join_token or server.join_token
            server.agents.append(self)
            if "name_key" not in options and server.out_dir is not None:
                # The run's own agents keep their name keys with the run: a resumed run (on another free
                # port, hence another server for client/name_key.py) proves the same names again.
                options["name_key"] = _run_name_key(Path(server.out_dir), name)
        else:
            url = server
        self.name = name
        opts = AgentOptions(server=url, name=name, task=task, join_token=join_token, slowdown=slowdown,
                            threads=threads, device=device, progress=False, **options)
        self._agent: _ClientAgent = ClientAgent(opts)
        self.stats: AgentStats | None = None
        self.error: str | None = None
        self._thread = threading.Thread(target=self._run, name=f"hermes-agent-{name}", daemon=True)
        if start:
            self.start()

    def _run(self) -> None:
        try:
            self.stats = self._agent.run()
        except Exception as exc:  # reported on the Result, not lost with the thread: any type
            self.error = f"{type(exc).__name__}: {exc}"
            log.warning("agent %s ended: %s", self.name, self.error)

    def start(self) -> Agent:
        if not self._thread.is_alive() and self.stats is None and self.error is None:
            self._thread.start()
        return self

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self, reason: str = "stopped from Python") -> None:
        self._agent.request_stop(reason)

    def join(self, timeout: float | None = None) -> None:
        if self._thread.ident is not None:
            self._thread.join(timeout)

    def __enter__(self) -> Agent:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.join(SHUTDOWN_TIMEOUT_S)


def _run_name_key(out_dir: Path, name: str) -> str:
    """The name key of this run's agent ``name``, kept in OUT/agent-keys (client/name_key.py's file rules)."""
    from hermes.client.name_key import key_at

    return key_at(out_dir / "agent-keys" / f"{name}.key")


def train(task: Task | str, *, agents: int = 4, preset: str | None = None, target: str | None = None,
          max_seconds: float | None = None, max_epochs: float | None = None, max_updates: int | None = None,
          out_dir: str | Path | None = None, config: dict[str, Any] | None = None,
          slowdowns: list[float] | None = None, timeout: float | None = None,
          callbacks: Sequence[Callback] = (), verbose: int = 1, resume: bool = False,
          overwrite: bool = False) -> Result:
    """Train ``task`` with a server and ``agents`` agents in this process until the target or a budget.

    More than ``PROCESS_AGENTS_MAX`` agents are simulated instead (``hermes.simulate`` on the
    testbed's homogeneous hl1 devices): the Result's seconds are then virtual seconds.

    ``target`` is ``"METRIC=VALUE"`` (the task says whether higher or lower
    is better); at least one of target, max_seconds, max_epochs, max_updates
    is required, so the call returns. Everything is shut down before it does.
    ``callbacks``, ``verbose``, ``resume`` and ``overwrite``: see :class:`Server`.
    """
    if target is None and max_seconds is None and max_epochs is None and max_updates is None:
        raise ValueError("train(): give a target (e.g. target='accuracy=0.9') or a budget (max_seconds, "
                         "max_epochs, max_updates), or the run never ends")
    if agents < 1:
        raise ValueError(f"train(): agents={agents}, need at least 1")
    if agents > PROCESS_AGENTS_MAX:
        # Threads of one process on this machine's cores: past the limit they starve each other
        # (agents=100 got 35 joined, 65 errors); the simulator runs the same engine on a virtual clock.
        if callbacks or resume:
            raise ValueError(f"train(): agents={agents} runs on the simulator (more than {PROCESS_AGENTS_MAX} agents), "
                             "which takes neither callbacks nor resume yet; use hermes.simulate or fewer agents")
        log.info("train(agents=%d): more than %d agents, simulated (hermes.api.simulate; seconds are virtual)",
                 agents, PROCESS_AGENTS_MAX)
        return simulate(task, devices=agents, population="hl1", preset=preset, target=target,
                        max_seconds=max_seconds, max_epochs=max_epochs, max_updates=max_updates, out_dir=out_dir,
                        config=config, slowdowns=slowdowns)
    with Server(task, preset=preset, target=target, max_seconds=max_seconds, max_epochs=max_epochs,
                max_updates=max_updates, out_dir=out_dir, config=config, callbacks=callbacks, verbose=verbose,
                resume=resume, overwrite=overwrite) as server:
        server.add_agents(agents, slowdowns=slowdowns)
        return server.wait(timeout=timeout)


def _default_out(name: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in name) or "task"
    return Path("runs") / f"{safe}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"



def _problem(error: Any) -> str:
    """One pydantic error as ``field: message`` (the run config's own messages already name the remedy)."""
    where = ".".join(str(p) for p in error.get("loc", ()) if p != "run") or "config"
    return f"{where}: {str(error.get('msg', '')).removeprefix('Value error, ')}"


class _Quiet:
    """The package's loggers at WARNING for a run (verbose < 2), as they were after it."""

    def __init__(self, verbose: int) -> None:
        self._logger = logging.getLogger("hermes")
        self._level = self._logger.level
        if verbose < 2:
            self._logger.setLevel(logging.WARNING)

    def restore(self) -> None:
        self._logger.setLevel(self._level)


def simulate(task: Task | str, *, devices: int | None = None, population: str = "hl8", preset: str | None = None,
             seed: int = 0, target: str | None = None, max_seconds: float | None = None,
             max_epochs: float | None = None, max_updates: int | None = None, out_dir: str | Path | None = None,
             config: dict[str, Any] | None = None, link: str | None = None, server_link_mbps: float = 1000.0,
             server_cost: str = "calibrated", slowdowns: list[float] | None = None,
             split: str = "shards", ray: str | None = None) -> Result:
    """Simulate ``task`` on ``devices`` devices of ``population`` (hl1..hl8, table2, generated, a trace file).

    ``max_seconds`` is in virtual seconds (default 3600). ``slowdowns``: one factor per device,
    dividing its compute speed (as ``hermes.train``'s emulated agents are slowed down). ``split``:
    ``shards`` (the server's, as the testbed), ``iid`` or ``dirichlet:ALPHA`` (``hermes-sim --split``).
    ``ray``: ``"auto"`` or a cluster's address trains the devices' cycles on Ray (``hermes-sim --ray``;
    the optional extra ``hermes-edge[ray]``), with the same summary as without it.
    """
    import dataclasses
    import math

    from hermes.common.config import DEFAULT_PRESET, build_config
    from hermes.common.task_registry import resolve_task
    from hermes.sim.links import ServerLink, transfer_seconds
    from hermes.sim.populations import build_population
    from hermes.sim.run import Simulation
    from hermes.sim.server_cost import by_name as cost_model

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
                     cost=cost_model(server_cost), population=population, link=link, split=split, ray=ray)
    summary = sim.run()
    return dataclasses.replace(result_from(out, {}), summary=summary)
