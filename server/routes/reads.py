"""The run as it stands, for people and tools: its workers, status, config and summary.

Open unless ``protect_reads``; then each needs the join or the admin token (``deps.readable``).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends

from hermes.server.engine import Engine
from hermes.server.limits import errors
from hermes.server.routes.deps import readable

router = APIRouter()


@router.get("/v1/workers", responses=errors(401))
def workers(engine: Engine = Depends(readable)) -> list[dict[str, Any]]:
    return [w.public() for w in engine.registry.all()]


@router.get("/v1/status", responses=errors(401))
def status(engine: Engine = Depends(readable)) -> dict[str, Any]:
    return engine.status()


@router.get("/v1/config", responses=errors(401))
def run_config(engine: Engine = Depends(readable)) -> dict[str, Any]:
    return engine.config.model_dump()


@router.get("/v1/summary", responses=errors(401))
def summary(engine: Engine = Depends(readable)) -> dict[str, Any]:
    return engine.summary()
