"""An agent's life in the run: register, heartbeat, leave, and (topology collective) regroup.

Registration is the door: rate-limited per client address, the join token,
the protocol version, the task and the kind of data checked before any state
is kept. The other routes authenticate the worker by its id and token.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Depends, Header, HTTPException, Request

from hermes.common.control_messages import CollectiveRendezvous, RegisterRequest, RegisterResponse, RegroupRequest
from hermes.common.signing import now_ms
from hermes.common.wire import PROTOCOL_VERSION, ProtocolError
from hermes.server.coordinator import GroupRunning, RegroupRefused
from hermes.server.engine import Engine
from hermes.server.limits import errors
from hermes.server.registry import JoinCapReached, NameInUse, NameOwned, RegistryFull, WorkerRecord
from hermes.server.routes.deps import ServerContext, client_host, context_of, engine_of

log = logging.getLogger(__name__)

router = APIRouter()


def _refuse(engine: Engine, status: int, outcome: str, message: str, client: str,
            headers: dict[str, str] | None = None) -> HTTPException:
    engine.metrics.registrations.labels(outcome=outcome).inc()
    log.warning("registration from %s refused (%s): %s", client, outcome, message)
    return HTTPException(status, message, headers=headers)


def _task_mismatch(engine: Engine, name: str | None, fingerprint: str | None) -> str:
    """Why an agent stating this task may not join (empty: it may)."""
    spec = engine.spec
    if (name is None or name == spec.task) and (fingerprint is None or fingerprint == spec.fingerprint):
        return ""
    return (f"task mismatch: this server trains task {spec.task!r} (fingerprint {spec.fingerprint}); "
            f"the agent has task {name!r} (fingerprint {fingerprint}): start it with the server's --task")


# Seconds a refusal that waiting does not cure asks a client to wait before trying again
# (every 429 and 503 carries a Retry-After, so no client retries in a tight loop).
_LONG_WAIT = 60


def _admit(engine: Engine, ctx: ServerContext, body: RegisterRequest, client: str, authorization: str) -> int:
    """Refuse a registration (HTTPException) before any state is kept, or return its join slot
    (which join token it presented; 0 without one)."""
    settings = ctx.settings
    retry_after = ctx.limiter.allow(client)
    if retry_after:
        engine.metrics.limit_hits.labels(limit="register_rate").inc()
        raise _refuse(engine, 429, "rate_limited",
                      f"more than {settings.register_burst} registrations at {settings.register_rate}/s "
                      f"from {client}; retry in {retry_after:.1f}s", client,
                      {"Retry-After": str(max(1, round(retry_after)))})
    slot = ctx.creds.join_slot(authorization) if ctx.creds.joins else 0
    if slot is None:
        raise _refuse(engine, 401, "unauthorized", "missing or wrong join token", client,
                      {"WWW-Authenticate": "Bearer"})
    if body.protocol_version != PROTOCOL_VERSION:
        engine.metrics.registrations.labels(outcome="bad_protocol").inc()
        raise HTTPException(426, f"protocol version {body.protocol_version} unsupported; server speaks {PROTOCOL_VERSION}")
    if engine.stopping and not engine.shutting_down:
        # 410, not 503: the run is over and will not come back; agents stop instead of retrying.
        raise HTTPException(410, f"the run is over: {engine.stop_reason}")
    if engine.stopping:
        raise HTTPException(503, "the server is shutting down", headers={"Retry-After": "5"})
    mismatch = _task_mismatch(engine, body.task, body.task_fingerprint)
    if mismatch:
        # Before any state: a worker training another model must not leave a ghost record.
        raise _refuse(engine, 409, "task_mismatch", mismatch, client)
    if engine.local_data != (body.local_samples is not None):
        # Before any state: a shard-fed agent in a local-data run (or the reverse) would train on nothing.
        raise _refuse(engine, 409, "data_mismatch",
                      "this run trains on device-local data (the task's local_data) but the agent declares no "
                      "local samples" if engine.local_data else
                      "the agent trains on device-local data but this run serves shards (its task has no "
                      "local_data)", client)
    return slot


@router.post("/v1/workers/register", response_model=RegisterResponse, responses=errors(400, 401, 408, 409, 410, 413, 422, 426, 429, 503))
def register(body: RegisterRequest, request: Request, authorization: str = Header(default=""),
             engine: Engine = Depends(engine_of), ctx: ServerContext = Depends(context_of)) -> RegisterResponse:
    engine.count_message("register")
    client = client_host(request)
    slot = _admit(engine, ctx, body, client, authorization)
    try:
        rec, rejoined = engine.register(
            body.name, threads=body.threads, device=body.device, slowdown=body.slowdown, hints=body.hints.known(),
            local_samples=body.local_samples or 0, name_key=body.name_key, join_slot=slot,
            join_cap=ctx.settings.join_token_max_workers,
        )
    except RegistryFull as exc:
        engine.metrics.limit_hits.labels(limit="max_workers").inc()
        raise _refuse(engine, 503, "full", str(exc), client, {"Retry-After": str(_LONG_WAIT)}) from None
    except JoinCapReached as exc:
        engine.metrics.limit_hits.labels(limit="join_token_max_workers").inc()
        raise _refuse(engine, 429, "join_cap", str(exc), client, {"Retry-After": str(_LONG_WAIT)}) from None
    except NameOwned as exc:
        raise _refuse(engine, 409, "name_owned", str(exc), client) from None
    except GroupRunning as exc:
        # 409, not 503: waiting will not open a place in a running collective group.
        raise _refuse(engine, 409, "group_running", str(exc), client) from None
    except NameInUse as exc:
        # Retry-After: when the holder would count as gone if it is a crashed agent being restarted.
        raise _refuse(engine, 409, "name_in_use", str(exc), client,
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
        heartbeat_interval_seconds=ctx.settings.heartbeat_interval_seconds,
        max_message_bytes=engine.max_message_bytes,
    )


def _worker(engine: Engine, worker_id: str, token: str) -> WorkerRecord:
    """The worker's record, if its token is right: 404 for an unknown id, 401 for a wrong token."""
    try:
        return engine.registry.authenticate(worker_id, token)
    except ProtocolError as exc:
        raise HTTPException(404 if exc.code.value == "unknown_worker" else 401, exc.message) from None


@router.post("/v1/workers/{worker_id}/heartbeat", responses=errors(401, 404, 408, 410, 413, 422))
def heartbeat(worker_id: str, x_hermes_token: str = Header(default=""),
              engine: Engine = Depends(engine_of)) -> dict[str, Any]:
    engine.count_message("heartbeat")
    rec = _worker(engine, worker_id, x_hermes_token)
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


@router.post("/v1/workers/{worker_id}/leave", responses=errors(401, 404, 408, 413, 422))
async def leave(worker_id: str, x_hermes_token: str = Header(default=""),
                engine: Engine = Depends(engine_of)) -> dict[str, Any]:
    engine.count_message("leave")
    rec = _worker(engine, worker_id, x_hermes_token)
    await engine.leave(worker_id, "agent said goodbye")
    return {"worker_id": worker_id, "state": rec.state}


@router.post("/v1/workers/{worker_id}/regroup", response_model=CollectiveRendezvous, responses=errors(400, 401, 404, 408, 409, 410, 413, 422))
async def regroup(worker_id: str, body: RegroupRequest, x_hermes_token: str = Header(default=""),
                  engine: Engine = Depends(engine_of)) -> CollectiveRendezvous:
    """Topology collective: a survivor of a broken group waits (up to collective_regroup_seconds)
    for the next generation and gets its rank in it."""
    engine.count_message("regroup")
    _worker(engine, worker_id, x_hermes_token)
    if engine.stopping:
        # 410 like registration: the run is over, the agent stops cleanly.
        raise HTTPException(410, f"the run is over: {engine.stop_reason}")
    try:
        rv = await engine.regroup(worker_id, body.generation)
    except RegroupRefused as exc:  # GroupTooSmall included: the run ends, this agent with an error
        log.warning("regroup of %s refused: %s", worker_id, exc)
        raise HTTPException(409, str(exc)) from None
    return CollectiveRendezvous(**rv)
