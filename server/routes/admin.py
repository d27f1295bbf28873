"""The operator's routes, with the admin token: ``/v1/stop`` ends the run (without a token configured,
SIGTERM); ``/v1/workers/{id}/release`` lets a quarantined worker's updates in again."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Depends, Header, HTTPException, Request

from hermes.server.auth import bearer, token_matches
from hermes.server.engine import Engine
from hermes.server.limits import errors
from hermes.server.routes.deps import ServerContext, client_host, context_of, engine_of

log = logging.getLogger(__name__)

router = APIRouter()


def _operator(request: Request, authorization: str, ctx: ServerContext, what: str, without: str) -> None:
    """Refuse (401/403) a caller without the admin token."""
    admin = ctx.creds.admin
    if not token_matches(bearer(authorization), admin):
        log.warning("%s request from %s refused: missing or wrong admin token", what, client_host(request))
        raise HTTPException(401 if admin else 403,
                            "needs the admin token (Authorization: Bearer ...)" if admin
                            else f"no admin token configured (HERMES_ADMIN_TOKEN); {without}",
                            headers={"WWW-Authenticate": "Bearer"})


@router.post("/v1/stop", responses=errors(401, 403, 408, 413, 422))
def stop(request: Request, reason: str = "operator request", authorization: str = Header(default=""),
         engine: Engine = Depends(engine_of), ctx: ServerContext = Depends(context_of)) -> dict[str, Any]:
    _operator(request, authorization, ctx, "stop", "stop the server with SIGTERM")
    engine.request_stop(reason[:200])
    return engine.status()


@router.post("/v1/workers/{worker_id}/release", responses=errors(401, 403, 404, 408, 409, 413, 422))
def release(worker_id: str, request: Request, authorization: str = Header(default=""),
            engine: Engine = Depends(engine_of), ctx: ServerContext = Depends(context_of)) -> dict[str, Any]:
    """Release a quarantined worker: its next updates are screened and folded as anyone's."""
    _operator(request, authorization, ctx, "release", "restart the server to clear quarantine")
    worker = engine.registry.get(worker_id)
    if worker is None:
        raise HTTPException(404, f"unknown worker id {worker_id!r}")
    if not engine.screening.quarantine.release(worker, "operator"):
        raise HTTPException(409, f"worker {worker_id} is not quarantined")
    log.warning("worker %s released from quarantine by the operator (%s)", worker_id, client_host(request))
    return {"worker_id": worker_id, "quarantined": False}
