"""FastAPI control plane, built by an app factory.

    uvicorn --factory hermes.server.app:create_app --port 8000

reads its settings from ``HERMES_*`` environment variables (see
ServerSettings); ``hermes-server`` passes them explicitly. The lifespan
starts the engine, the evaluator, the ZeroMQ data plane, the heartbeat
monitor and the checkpointer, and stops them cleanly on shutdown (SIGTERM):
held requests are answered "unavailable", a last checkpoint is written,
then the server summary.

Credentials (hermes.server.auth) are resolved here, so an app without a
join token fails to build, and uvicorn to start, unless ``insecure``.
The routes are ``hermes.server.routes``' routers (and the dashboard's);
the factory checks what can be checked before anything binds, keeps the
result in ``app.state.context`` and assembles them.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import torch
import zmq
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from hermes import server as server_package
from hermes.common.datasource import SampleSource, check_dtypes
from hermes.common.kafka_layout import KafkaUnavailable
from hermes.common.policies.topology import topology_of
from hermes.common.task import Task, as_dataset
from hermes.common.task_registry import check_task, resolve_task
from hermes.server.auth import RateLimiter
from hermes.server.checkpoint import Checkpointer
from hermes.server.console import Progress, configure_logging, quiet_access_log
from hermes.server.credentials import Credentials
from hermes.server.dashboard import build_router, watch_run
from hermes.server.dataplane import DataPlane
from hermes.server.done import exit_when_done
from hermes.server.engine import Engine
from hermes.server.engine.local import local_data_refusal
from hermes.server.events import EventLog
from hermes.server.heartbeat import HeartbeatMonitor
from hermes.server.kafka_publish import KafkaOptions
from hermes.server.limits import BodyLimits
from hermes.server.metrics import ServerMetrics
from hermes.server.outdir import prepare_out_dir
from hermes.server.routes import admin, probes, reads, workers
from hermes.server.routes.deps import ServerContext, readable
from hermes.server.settings import ServerSettings, server_version

log = logging.getLogger(__name__)


def create_app(settings: ServerSettings | None = None, task: Task | None = None) -> FastAPI:
    """The app for ``settings``; ``task`` (a Task object) instead of the config's ``task`` reference.

    The task is resolved and checked here, before anything binds: a broken
    one raises TaskError (a ValueError) naming the task and the field.
    """
    ctx = _resolve(settings or ServerSettings(), task)
    # /docs is served by the dashboard router from local files; FastAPI's own pages load them from a CDN.
    app = FastAPI(title="Hermes parameter server", version=server_version(), lifespan=lifespan, docs_url=None,
                  redoc_url=None)
    app.state.context = ctx
    # Outermost: an oversized or stalled body is refused before FastAPI reads or parses it.
    app.add_middleware(BodyLimits, read_timeout=ctx.settings.http_read_timeout_seconds)
    # Tasks started on the loop outside any request (--exit-when-done's wait), kept from the GC.
    app.state.background = set()
    app.add_exception_handler(RequestValidationError, _invalid)  # type: ignore[arg-type]
    # In this order: it is the order of the paths in /openapi.json.
    app.include_router(build_router(readable))
    for router in (probes.router, workers.router, reads.router, admin.router):
        app.include_router(router)
    return app


def _resolve(settings: ServerSettings, task: Task | None) -> ServerContext:
    """Settings, credentials and task checked, the output folder prepared: what the lifespan and routes use."""
    # Once per process: hermes-server did it already; under uvicorn --factory this is the first call.
    configure_logging(settings.log_level)
    config = settings.run_config()
    creds = Credentials(settings)  # checks the tokens (before the task's data is loaded); writes nothing yet
    task = resolve_task(task if task is not None else config.task, config)
    check_task(task, config, role="server")
    if task.local_data is not None and (why := local_data_refusal(config)) is not None:
        # Refused before anything binds (exit 2), not when the lifespan builds the engine.
        raise ValueError(f"preset {config.preset!r} cannot train on device-local data: {why}")
    if task.train_data is not None:
        # A dtype shard records cannot carry (complex, object): one line at start-up, not at the first fetch.
        check_dtypes(SampleSource(as_dataset(task.train_data), f"task {task.name}: train_data"))
    if settings.out_dir:
        # Before the admin token is written into it: another run's outputs are refused, or replaced.
        prepare_out_dir(settings.out_dir, resume=settings.resume, overwrite=settings.overwrite)
    else:
        log.warning("no out_dir: neither the final nor the best model of this run will be saved "
                    "(set --out or HERMES_OUT_DIR)")
    creds.save()
    limiter = RateLimiter(settings.register_rate, settings.register_burst)
    if creds.insecure:
        log.warning("--insecure: no join token is checked; anyone who reaches this server can join")
    if creds.admin_file is not None:
        log.info("admin token for /v1/stop written to %s", creds.admin_file)
    return ServerContext(settings=settings, config=config, task=task, creds=creds, limiter=limiter)


async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
    # FastAPI's default handler echoes each error's input: a non-finite
    # float ({"slowdown": 1e309}) made that echo a 500, and a large body
    # came back whole. Where and why is enough for the client.
    errors = [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg", ""))[:200], "type": e.get("type", "")}
              for e in exc.errors()[:20]]
    return JSONResponse(status_code=422, content={"detail": errors})


# ---------------------------------------------------------------- the lifespan


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Start the engine and everything around it; on shutdown stop them, checkpoint, write the summary."""
    ctx: ServerContext = app.state.context
    settings, config = ctx.settings, ctx.config
    events = EventLog(f"{settings.out_dir}/events.jsonl" if settings.out_dir else None)
    engine = Engine(
        config,
        metrics=ServerMetrics(),
        events=events,
        max_workers=settings.max_workers,
        max_message_bytes=settings.max_message_bytes,
        out_dir=settings.out_dir,
        replay_window_seconds=settings.replay_window_seconds,
        screening=settings.screening,
        task=ctx.task,
        takeover_after=3 * settings.heartbeat_interval_seconds,
    )
    if settings.exit_when_done:
        engine.on_stop.append(lambda reason: exit_when_done(app, engine, reason))
    app.state.history, tensorboard = watch_run(engine, settings)
    # Subscribers set by the creator of the app (hermes.Server's callbacks), before the first fact.
    for listener in getattr(app.state, "listeners", ()):
        engine.telemetry.subscribe(listener)
    checkpoints = _open_checkpoints(engine, settings, events)
    await _publish_shards(engine, settings, events)
    if topology_of(config.topology).needs_coordinator:
        engine.start_coordinator(bind_host=settings.data_host, port=settings.collective_port,
                                 advertise_host=settings.advertise_host)
    plane = DataPlane(engine, settings.data_host, settings.data_port)
    port = await _start_data_plane(plane, settings, events)
    engine.start()
    monitor = HeartbeatMonitor(engine, settings.heartbeat_timeout_seconds)
    monitor.start()
    if checkpoints is not None:
        checkpoints.start()
    quiet_access_log(not settings.access_log)
    progress = Progress(engine, settings.progress_interval_seconds)
    progress.start()
    app.state.engine = engine
    # What start-up built (torch, the task, the data) lives as long as the server: frozen out of
    # the collector's reach, a full collection no longer walks it (0.4 s each under load; issue 17).
    gc.collect()
    gc.freeze()
    app.state.data_plane_address = f"tcp://{settings.advertise_host}:{port}"
    log.info("hermes server ready: preset=%s task=%s (fingerprint %s) model=%s data plane %s",
             config.preset, ctx.task.name, engine.spec.fingerprint, engine.spec.name, app.state.data_plane_address)
    if server_package.OMP_SPINS and torch.get_num_threads() > 1:
        log.info("torch was imported before hermes.server: its %d OpenMP threads busy-wait between requests "
                 "(server/__init__.py); set OMP_WAIT_POLICY=PASSIVE before importing torch to stop them",
                 torch.get_num_threads())
    try:
        yield
    finally:
        # The run goes on after a restart: agents hear "unavailable", not "stop".
        await progress.stop()
        engine.begin_shutdown()
        await monitor.stop()
        await plane.stop()
        if checkpoints is not None:
            await checkpoints.stop()
            # A failure is logged, not raised: the journal still holds every acknowledged update.
            await checkpoints.save_or_report("shutdown")
            checkpoints.close()
        engine.shutdown()
        if tensorboard is not None:  # after the shutdown's last evaluation
            tensorboard.close()


def _open_checkpoints(engine: Engine, settings: ServerSettings, events: EventLog) -> Checkpointer | None:
    if not settings.checkpoint_dir:
        return None
    checkpoints = Checkpointer(engine, settings.checkpoint_dir, interval=settings.checkpoint_interval_seconds,
                               durable_acks=settings.durable_acks)
    try:
        checkpoints.open(resume=settings.resume, overwrite=settings.overwrite,
                         truncate_corrupt=settings.resume_truncate_corrupt)
    except Exception as exc:
        log.error("cannot start: %s", exc)
        events.close()
        raise
    engine.attach_checkpoints(checkpoints)
    return checkpoints


async def _publish_shards(engine: Engine, settings: ServerSettings, events: EventLog) -> None:
    if not settings.kafka_bootstrap:
        return
    # Blocking kafka-python calls: off the event loop, before serving.
    opts = KafkaOptions(settings.kafka_bootstrap, partitions=settings.kafka_partitions,
                        retries=settings.kafka_retries)
    try:
        await asyncio.to_thread(engine.publish_to_kafka, opts)
    except Exception as exc:
        # KafkaUnavailable names the bootstrap address and the attempts made.
        log.error("cannot start: %s", exc if isinstance(exc, KafkaUnavailable)
                  else f"publishing shards to Kafka at {settings.kafka_bootstrap} failed: {exc!r}")
        events.close()
        raise


async def _start_data_plane(plane: DataPlane, settings: ServerSettings, events: EventLog) -> int:
    try:
        return await plane.start()
    except zmq.ZMQError as exc:  # hermes-server checks the port first; the uvicorn factory meets it here
        log.error("cannot start: data port %s on %s: %s; choose another with --data-port (HERMES_DATA_PORT, "
                  "0 = a free one)", settings.data_port, settings.data_host, exc)
        events.close()
        raise
