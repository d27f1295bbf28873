"""The run as it stands, for people and tools: its workers, status, config and summary.

Open unless ``protect_reads``; then each needs the join or the admin token (``deps.readable``).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Header, Request

from hermes.server.auth import bearer, token_matches
from hermes.server.engine import Engine
from hermes.server.limits import errors
from hermes.server.routes.deps import readable

# What of screening anyone may read: whether it is on and what it refused. Its thresholds
# (the median norm, and whatever bounds it publishes) help an attacker size an update just
# under them (issue 29: k x the published median), so they need the join or the admin token.
_OPEN_SCREENING = ("enabled", "refusals", "quarantined")


def _screened(body: dict[str, Any], request: Request, authorization: str) -> dict[str, Any]:
    creds = request.app.state.context.creds
    member = any(secret is not None and token_matches(bearer(authorization), secret)
                 for secret in (*creds.joins, creds.admin))
    screening = body.get("screening")
    if member or not isinstance(screening, dict):
        return body
    return body | {"screening": {k: v for k, v in screening.items() if k in _OPEN_SCREENING}}

router = APIRouter()


@router.get("/v1/workers", responses=errors(401))
def workers(engine: Engine = Depends(readable)) -> list[dict[str, Any]]:
    return [w.public() for w in engine.registry.all()]


@router.get("/v1/status", responses=errors(401))
def status(request: Request, authorization: str = Header(default=""),
           engine: Engine = Depends(readable)) -> dict[str, Any]:
    return _screened(engine.status(), request, authorization)


@router.get("/v1/config", responses=errors(401))
def run_config(engine: Engine = Depends(readable)) -> dict[str, Any]:
    return engine.config.model_dump()


@router.get("/v1/summary", responses=errors(401))
def summary(request: Request, authorization: str = Header(default=""),
            engine: Engine = Depends(readable)) -> dict[str, Any]:
    return _screened(engine.summary(), request, authorization)
