"""``/healthz`` (always open: liveness for orchestrators) and ``/metrics`` (Prometheus, a read endpoint)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Response
from fastapi.responses import PlainTextResponse

from hermes.server.engine import Engine
from hermes.server.limits import errors
from hermes.server.metrics import CONTENT_TYPE
from hermes.server.routes.deps import engine_of, readable

router = APIRouter()


@router.get("/healthz")
def healthz(engine: Engine = Depends(engine_of)) -> dict[str, Any]:
    return {"status": "ok", "model_version": engine.state.version, "stopping": engine.stopping}


# Declared as text (the Prometheus exposition format), which is what it returns.
@router.get("/metrics", response_class=PlainTextResponse, responses=errors(401))
def metrics(engine: Engine = Depends(readable)) -> Response:
    return Response(engine.metrics.render(), media_type=CONTENT_TYPE)
