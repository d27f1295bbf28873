"""FastAPI control plane, built by an app factory.

    uvicorn --factory hermes.server.app:create_app --port 8000

reads its settings from ``HERMES_*`` environment variables (see
ServerSettings); ``hermes-server`` passes them explicitly. The lifespan
starts the engine, the evaluator and the ZeroMQ data plane, and stops them
cleanly (writing the server summary) on shutdown.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Header, HTTPException, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from hermes.common.kafka_layout import KafkaUnavailable
from hermes.common.wire import PROTOCOL_VERSION
from hermes.server.dataplane import DataPlane
from hermes.server.engine import Engine
from hermes.server.events import EventLog
from hermes.server.kafka_publish import KafkaOptions
from hermes.server.metrics import CONTENT_TYPE, ServerMetrics
from hermes.server.registry import RegistryFull
from hermes.server.settings import ServerSettings

log = logging.getLogger(__name__)


class RegisterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:@-]+$")
    threads: int = Field(default=1, ge=1, le=1024)
    device: str = Field(default="cpu", max_length=32)
    slowdown: float = Field(default=1.0, ge=1.0, le=1000.0)
    hints: dict[str, Any] = Field(default_factory=dict)
    protocol_version: int = PROTOCOL_VERSION


class RegisterResponse(BaseModel):
    worker_id: str
    token: str
    rejoined: bool
    protocol_version: int
    data_plane: str
    model_spec: dict[str, Any]
    run_config: dict[str, Any]
    # Fixed local validation split for this worker's update gate (shard ids, split "validation").
    validation_shards: list[int]
    # Where shard records come from: {"source": "zmq"} or the Kafka topics and
    # this worker's validation ranges ({"source": "kafka", "bootstrap", ...}).
    data_source: dict[str, Any] = Field(default_factory=lambda: {"source": "zmq"})
    # Topology "collective": rank, world_size, master_addr, master_port, timeout_seconds.
    collective: dict[str, Any] | None = None


def create_app(settings: ServerSettings | None = None) -> FastAPI:
    settings = settings or ServerSettings()
    config = settings.run_config()

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
        )
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
        if config.topology == "collective":
            engine.start_coordinator(bind_host=settings.data_host, port=settings.collective_port,
                                     advertise_host=settings.advertise_host)
        plane = DataPlane(engine, settings.data_host, settings.data_port)
        port = await plane.start()
        engine.start()
        app.state.engine = engine
        app.state.data_plane_address = f"tcp://{settings.advertise_host}:{port}"
        log.info("hermes server ready: preset=%s model=%s dataset=%s data plane %s",
                 config.preset, config.model, config.dataset, app.state.data_plane_address)
        try:
            yield
        finally:
            engine.request_stop("server shutdown")
            await plane.stop()
            engine.shutdown()

    app = FastAPI(title="Hermes parameter server", version="0.1.0", lifespan=lifespan)

    def engine_of(request: Request) -> Engine:
        return request.app.state.engine

    @app.get("/healthz")
    def healthz(request: Request) -> dict[str, Any]:
        engine = engine_of(request)
        return {"status": "ok", "model_version": engine.state.version, "stopping": engine.stopping}

    @app.get("/metrics")
    def metrics(request: Request) -> Response:
        return Response(engine_of(request).metrics.render(), media_type=CONTENT_TYPE)

    @app.post("/v1/workers/register", response_model=RegisterResponse)
    def register(body: RegisterRequest, request: Request) -> RegisterResponse:
        engine = engine_of(request)
        if body.protocol_version != PROTOCOL_VERSION:
            engine.metrics.registrations.labels(outcome="bad_protocol").inc()
            raise HTTPException(426, f"protocol version {body.protocol_version} unsupported; server speaks {PROTOCOL_VERSION}")
        if engine.stopping:
            raise HTTPException(503, "the run is stopping")
        try:
            rec, rejoined = engine.register(
                body.name, threads=body.threads, device=body.device, slowdown=body.slowdown, hints=dict(body.hints)
            )
        except RegistryFull as exc:
            engine.metrics.registrations.labels(outcome="full").inc()
            raise HTTPException(503, str(exc)) from None
        engine.metrics.registrations.labels(outcome="ok").inc()
        return RegisterResponse(
            worker_id=rec.id,
            token=rec.token,
            rejoined=rejoined,
            protocol_version=PROTOCOL_VERSION,
            data_plane=request.app.state.data_plane_address,
            model_spec=engine.spec.to_dict(),
            run_config=engine.config.model_dump(),
            validation_shards=engine.validation_shards_for(rec),
            data_source=engine.data_source_for(rec),
            collective=engine.collective_for(rec),
        )

    @app.post("/v1/workers/{worker_id}/leave")
    async def leave(worker_id: str, request: Request, x_hermes_token: str = Header(default="")) -> dict[str, Any]:
        engine = engine_of(request)
        rec = engine.registry.get(worker_id)
        if rec is None:
            raise HTTPException(404, f"unknown worker {worker_id!r}")
        if not hmac.compare_digest(x_hermes_token.encode(), rec.token.encode()):
            raise HTTPException(401, "bad worker token")
        await engine.leave(worker_id, "agent said goodbye")
        return {"worker_id": worker_id, "state": rec.state}

    @app.get("/v1/workers")
    def workers(request: Request) -> list[dict[str, Any]]:
        return [w.public() for w in engine_of(request).registry.all()]

    @app.get("/v1/status")
    def status(request: Request) -> dict[str, Any]:
        return engine_of(request).status()

    @app.get("/v1/config")
    def run_config(request: Request) -> dict[str, Any]:
        return engine_of(request).config.model_dump()

    @app.get("/v1/summary")
    def summary(request: Request) -> dict[str, Any]:
        return engine_of(request).summary()

    @app.post("/v1/stop")
    def stop(request: Request, reason: str = "operator request") -> dict[str, Any]:
        engine = engine_of(request)
        engine.request_stop(reason[:200])
        return engine.status()

    return app
