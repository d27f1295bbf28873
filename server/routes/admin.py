"""``/v1/stop``: the operator ends the run, with the admin token (without one configured, SIGTERM)."""

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


@router.post("/v1/stop", responses=errors(401, 403, 408, 413, 422))
def stop(request: Request, reason: str = "operator request", authorization: str = Header(default=""),
         engine: Engine = Depends(engine_of), ctx: ServerContext = Depends(context_of)) -> dict[str, Any]:
    admin = ctx.creds.admin
    if not token_matches(bearer(authorization), admin):
        log.warning("stop request from %s refused: missing or wrong admin token", client_host(request))
        raise HTTPException(401 if admin else 403,
                            "needs the admin token (Authorization: Bearer ...)" if admin
                            else "no admin token configured (HERMES_ADMIN_TOKEN); stop the server with SIGTERM",
                            headers={"WWW-Authenticate": "Bearer"})
    engine.request_stop(reason[:200])
    return engine.status()
