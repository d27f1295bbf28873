"""What the routers share: the app's resolved context, the engine, the read guard.

``create_app`` resolves the settings, the credentials and the task once and keeps
them in ``app.state.context`` (a ``ServerContext``); the lifespan puts the engine in
``app.state.engine``. Routes reach both through the dependencies here.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from fastapi import Header, HTTPException, Request

from hermes.common.config import RunConfig
from hermes.common.task import Task
from hermes.server.auth import RateLimiter
from hermes.server.credentials import Credentials
from hermes.server.engine import Engine
from hermes.server.settings import ServerSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerContext:
    """What the app factory resolved and checked, for the lifespan and the routes."""

    settings: ServerSettings
    config: RunConfig
    task: Task
    creds: Credentials
    limiter: RateLimiter  # registrations per client address


async def context_of(request: Request) -> ServerContext:
    return request.app.state.context


async def engine_of(request: Request) -> Engine:
    return request.app.state.engine


def client_host(request: Request) -> str:
    return request.client.host if request.client else "unknown"


def readable(request: Request, authorization: str = Header(default="")) -> Engine:
    """The engine, for a read endpoint: refused (401) under protect_reads without a valid token."""
    engine: Engine = request.app.state.engine
    creds: Credentials = request.app.state.context.creds
    if not creds.may_read(authorization):
        endpoint = request.url.path
        engine.metrics.reads_refused.labels(endpoint=endpoint).inc()
        log.warning("read of %s from %s refused: missing or wrong token", endpoint, client_host(request))
        raise HTTPException(401, "this server protects its read endpoints: send the join or the admin token "
                                 "(Authorization: Bearer ...)", headers={"WWW-Authenticate": "Bearer"})
    return engine
