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
"""

from __future__ import annotations

import asyncio
import gc
import logging
from contextlib import asynccontextmanager
from typing import Any

import zmq
from fastapi import Depends, FastAPI, Header, HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from hermes.common.control_messages import CollectiveRendezvous, RegisterRequest, RegisterResponse, RegroupRequest
from hermes.common.datasource import SampleSource, check_dtypes
from hermes.common.kafka_layout import KafkaUnavailable
from hermes.common.policies import base as registry
from hermes.common.signing import now_ms
from hermes.common.task import Task, as_dataset
from hermes.common.task_registry import check_task, resolve_task
from hermes.common.wire import PROTOCOL_VERSION, ProtocolError
from hermes.server.auth import RateLimiter, bearer, token_matches
from hermes.server.checkpoint import Checkpointer
from hermes.server.console import Progress, configure_logging, quiet_access_log
from hermes.server.coordinator import GroupRunning, RegroupRefused
from hermes.server.credentials import Credentials
from hermes.server.dashboard import build_router, watch_run
from hermes.server.dataplane import DataPlane
from hermes.server.done import exit_when_done
from hermes.server.engine import Engine
from hermes.server.engine.local import local_data_refusal
from hermes.server.events import EventLog
from hermes.server.heartbeat import HeartbeatMonitor
from hermes.server.kafka_publish import KafkaOptions
from hermes.server.limits import BodyLimits, errors
from hermes.server.metrics import CONTENT_TYPE, ServerMetrics
from hermes.server.outdir import prepare_out_dir
from hermes.server.registry import NameInUse, RegistryFull
from hermes.server.settings import ServerSettings, server_version

log = logging.getLogger(__name__)


def create_app(settings: ServerSettings | None = None, task: Task | None = None) -> FastAPI:
    """The app for ``settings``; ``task`` (a Task object) instead of the config's ``task`` reference.

    The task is resolved and checked here, before anything binds: a broken
    one raises TaskError (a ValueError) naming the task and the field.
    """
    settings = settings or ServerSettings()
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

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        metrics = ServerMetrics()
        events = EventLog(f"{settings.out_dir}/events.jsonl" if settings.out_dir else None)
        engine = Engine(
            config,
            metrics=metrics,
            events=events,
            max_workers=settings.max_workers,
            max_message_bytes=settings.max_message_bytes,
            out_dir=settings.out_dir,
            replay_window_seconds=settings.replay_window_seconds,
            screening=settings.screening,
            task=task,
            takeover_after=3 * settings.heartbeat_interval_seconds,
        )
        if settings.exit_when_done:
            engine.on_stop.append(lambda reason: exit_when_done(app, engine, reason))
        app.state.history, tensorboard = watch_run(engine, settings)
        checkpoints = None
        if settings.checkpoint_dir:
            checkpoints = Checkpointer(engine, settings.checkpoint_dir, interval=settings.checkpoint_interval_seconds,
                                       durable_acks=settings.durable_acks)
            try:
                checkpoints.open(resume=settings.resume, overwrite=settings.overwrite)
            except Exception as exc:
                log.error("cannot start: %s", exc)
                events.close()
                raise
            engine.attach_checkpoints(checkpoints)
        if settings.kafka_bootstrap:
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
        if registry.get("topology", config.topology).needs_coordinator:
            engine.start_coordinator(bind_host=settings.data_host, port=settings.collective_port,
                                     advertise_host=settings.advertise_host)
        plane = DataPlane(engine, settings.data_host, settings.data_port)
        try:
            port = await plane.start()
        except zmq.ZMQError as exc:  # hermes-server checks the port first; the uvicorn factory meets it here
            log.error("cannot start: data port %s on %s: %s; choose another with --data-port (HERMES_DATA_PORT, "
                      "0 = a free one)", settings.data_port, settings.data_host, exc)
            events.close()
            raise
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
                 config.preset, task.name, engine.spec.fingerprint, engine.spec.name, app.state.data_plane_address)
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

    # /docs is served by the dashboard router from local files; FastAPI's own pages load them from a CDN.
    app = FastAPI(title="Hermes parameter server", version=server_version(), lifespan=lifespan, docs_url=None, redoc_url=None)
    # Outermost: an oversized or stalled body is refused before FastAPI reads or parses it.
    app.add_middleware(BodyLimits, read_timeout=settings.http_read_timeout_seconds)
    # Tasks started on the loop outside any request (--exit-when-done's wait), kept from the GC.
    app.state.background = set()

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's default handler echoes each error's input: a non-finite
        # float ({"slowdown": 1e309}) made that echo a 500, and a large body
        # came back whole. Where and why is enough for the client.
        errors = [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg", ""))[:200], "type": e.get("type", "")}
                  for e in exc.errors()[:20]]
        return JSONResponse(status_code=422, content={"detail": errors})

    def engine_of(request: Request) -> Engine:
        return request.app.state.engine

    def readable(request: Request, authorization: str = Header(default="")) -> Engine:
        """The engine, for a read endpoint: refused (401) under protect_reads without a valid token."""
        engine = engine_of(request)
        if not creds.may_read(authorization):
            endpoint = request.url.path
            engine.metrics.reads_refused.labels(endpoint=endpoint).inc()
            client = request.client.host if request.client else "unknown"
            log.warning("read of %s from %s refused: missing or wrong token", endpoint, client)
            raise HTTPException(401, "this server protects its read endpoints: send the join or the admin token "
                                     "(Authorization: Bearer ...)", headers={"WWW-Authenticate": "Bearer"})
        return engine

    app.include_router(build_router(readable))

    @app.get("/healthz")
    def healthz(request: Request) -> dict[str, Any]:
        engine = engine_of(request)
        return {"status": "ok", "model_version": engine.state.version, "stopping": engine.stopping}

    @app.get("/metrics", responses=errors(401))
    def metrics(engine: Engine = Depends(readable)) -> Response:
        return Response(engine.metrics.render(), media_type=CONTENT_TYPE)

    def refuse(engine: Engine, status: int, outcome: str, message: str, client: str,
               headers: dict[str, str] | None = None) -> HTTPException:
        engine.metrics.registrations.labels(outcome=outcome).inc()
        log.warning("registration from %s refused (%s): %s", client, outcome, message)
        return HTTPException(status, message, headers=headers)

    @app.post("/v1/workers/register", response_model=RegisterResponse, responses=errors(401, 408, 409, 410, 413, 422, 426, 429, 503))
    def register(body: RegisterRequest, request: Request, authorization: str = Header(default="")) -> RegisterResponse:
        engine = engine_of(request)
        engine.count_message("register")
        client = request.client.host if request.client else "unknown"
        retry_after = limiter.allow(client)
        if retry_after:
            engine.metrics.limit_hits.labels(limit="register_rate").inc()
            raise refuse(engine, 429, "rate_limited",
                         f"more than {settings.register_burst} registrations at {settings.register_rate}/s "
                         f"from {client}; retry in {retry_after:.1f}s", client,
                         {"Retry-After": str(max(1, round(retry_after)))})
        if creds.join is not None and not token_matches(bearer(authorization), creds.join):
            raise refuse(engine, 401, "unauthorized", "missing or wrong join token", client,
                         {"WWW-Authenticate": "Bearer"})
        if body.protocol_version != PROTOCOL_VERSION:
            engine.metrics.registrations.labels(outcome="bad_protocol").inc()
            raise HTTPException(426, f"protocol version {body.protocol_version} unsupported; server speaks {PROTOCOL_VERSION}")
        if engine.stopping and not engine.shutting_down:
            # 410, not 503: the run is over and will not come back; agents stop instead of retrying.
            raise HTTPException(410, f"the run is over: {engine.stop_reason}")
        if engine.stopping:
            raise HTTPException(503, "the server is shutting down")
        mismatch = _task_mismatch(engine, body.task, body.task_fingerprint)
        if mismatch:
            # Before any state: a worker training another model must not leave a ghost record.
            raise refuse(engine, 409, "task_mismatch", mismatch, client)
        if engine.local_data != (body.local_samples is not None):
            # Before any state: a shard-fed agent in a local-data run (or the reverse) would train on nothing.
            raise refuse(engine, 409, "data_mismatch",
                         "this run trains on device-local data (the task's local_data) but the agent declares no "
                         "local samples" if engine.local_data else
                         "the agent trains on device-local data but this run serves shards (its task has no "
                         "local_data)", client)
        try:
            rec, rejoined = engine.register(
                body.name, threads=body.threads, device=body.device, slowdown=body.slowdown, hints=body.hints.known(),
                local_samples=body.local_samples or 0,
            )
        except RegistryFull as exc:
            engine.metrics.limit_hits.labels(limit="max_workers").inc()
            raise refuse(engine, 503, "full", str(exc), client) from None
        except GroupRunning as exc:
            # 409, not 503: waiting will not open a place in a running collective group.
            raise refuse(engine, 409, "group_running", str(exc), client) from None
        except NameInUse as exc:
            # Retry-After: when the holder would count as gone if it is a crashed agent being restarted.
            raise refuse(engine, 409, "name_in_use", str(exc), client,
                         {"Retry-After": str(max(1, round(exc.retry_after)))}) from None
        engine.metrics.registrations.labels(outcome="ok").inc()
        return RegisterResponse(
            worker_id=rec.id,
            token=rec.token,
            rejoined=rejoined,
            protocol_version=PROTOCOL_VERSION,
            data_plane=request.app.state.data_plane_address,
            model_spec=engine.spec.to_dict(),
            run_config=engine.config.model_dump(),
            validation_shards=engine.membership.validation_shards_for(rec),
            data_source=engine.data_source_for(rec),
            collective=engine.collective.rendezvous_for(rec),
            server_time_ms=now_ms(),
            heartbeat_interval_seconds=settings.heartbeat_interval_seconds,
            max_message_bytes=engine.max_message_bytes,
        )

    def worker_of(engine: Engine, worker_id: str, token: str):
        try:
            return engine.registry.authenticate(worker_id, token)
        except ProtocolError as exc:
            raise HTTPException(404 if exc.code.value == "unknown_worker" else 401, exc.message) from None

    @app.post("/v1/workers/{worker_id}/heartbeat", responses=errors(401, 404, 408, 410, 413, 422))
    def heartbeat(worker_id: str, request: Request, x_hermes_token: str = Header(default="")) -> dict[str, Any]:
        engine = engine_of(request)
        engine.count_message("heartbeat")
        rec = worker_of(engine, worker_id, x_hermes_token)
        if rec.state != "active":
            # 410: the agent registers again (same name, same id) and catches up.
            raise HTTPException(410, f"worker {worker_id} is {rec.state}; register again")
        rec.last_seen = engine.clock.time()
        engine.metrics.heartbeats.inc()
        reply = {"state": rec.state, "model_version": engine.state.version, "stop": engine.stopping}
        broken = engine.collective.broken_generation_for(rec)
        if broken is not None:
            # Topology collective: the group is re-forming without this worker's report yet;
            # it may be stuck in a collective that will only time out.
            reply["collective_broken"] = broken
        return reply

    @app.post("/v1/workers/{worker_id}/leave", responses=errors(401, 404, 408, 413, 422))
    async def leave(worker_id: str, request: Request, x_hermes_token: str = Header(default="")) -> dict[str, Any]:
        engine = engine_of(request)
        engine.count_message("leave")
        rec = worker_of(engine, worker_id, x_hermes_token)
        await engine.leave(worker_id, "agent said goodbye")
        return {"worker_id": worker_id, "state": rec.state}

    @app.post("/v1/workers/{worker_id}/regroup", response_model=CollectiveRendezvous, responses=errors(401, 404, 408, 409, 410, 413, 422))
    async def regroup(worker_id: str, body: RegroupRequest, request: Request,
                      x_hermes_token: str = Header(default="")) -> CollectiveRendezvous:
        """Topology collective: a survivor of a broken group waits (up to collective_regroup_seconds)
        for the next generation and gets its rank in it."""
        engine = engine_of(request)
        engine.count_message("regroup")
        worker_of(engine, worker_id, x_hermes_token)
        if engine.stopping:
            # 410 like registration: the run is over, the agent stops cleanly.
            raise HTTPException(410, f"the run is over: {engine.stop_reason}")
        try:
            rv = await engine.regroup(worker_id, body.generation)
        except RegroupRefused as exc:  # GroupTooSmall included: the run ends, this agent with an error
            log.warning("regroup of %s refused: %s", worker_id, exc)
            raise HTTPException(409, str(exc)) from None
        return CollectiveRendezvous(**rv)

    @app.get("/v1/workers", responses=errors(401))
    def workers(engine: Engine = Depends(readable)) -> list[dict[str, Any]]:
        return [w.public() for w in engine.registry.all()]

    @app.get("/v1/status", responses=errors(401))
    def status(engine: Engine = Depends(readable)) -> dict[str, Any]:
        return engine.status()

    @app.get("/v1/config", responses=errors(401))
    def run_config(engine: Engine = Depends(readable)) -> dict[str, Any]:
        return engine.config.model_dump()

    @app.get("/v1/summary", responses=errors(401))
    def summary(engine: Engine = Depends(readable)) -> dict[str, Any]:
        return engine.summary()

    @app.post("/v1/stop", responses=errors(401, 403, 408, 413, 422))
    def stop(request: Request, reason: str = "operator request", authorization: str = Header(default="")) -> dict[str, Any]:
        engine = engine_of(request)
        if not token_matches(bearer(authorization), creds.admin):
            client = request.client.host if request.client else "unknown"
            log.warning("stop request from %s refused: missing or wrong admin token", client)
            raise HTTPException(401 if creds.admin else 403,
                                "needs the admin token (Authorization: Bearer ...)" if creds.admin
                                else "no admin token configured (HERMES_ADMIN_TOKEN); stop the server with SIGTERM",
                                headers={"WWW-Authenticate": "Bearer"})
        engine.request_stop(reason[:200])
        return engine.status()

    return app


def _task_mismatch(engine: Engine, name: str | None, fingerprint: str | None) -> str:
    """Why an agent stating this task may not join (empty: it may)."""
    spec = engine.spec
    if (name is None or name == spec.task) and (fingerprint is None or fingerprint == spec.fingerprint):
        return ""
    return (f"task mismatch: this server trains task {spec.task!r} (fingerprint {spec.fingerprint}); "
            f"the agent has task {name!r} (fingerprint {fingerprint}): start it with the server's --task")

