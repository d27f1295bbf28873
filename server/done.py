"""``--exit-when-done``: the server process ends itself once its run is over."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastapi import FastAPI

    from hermes.server.engine import Engine

log = logging.getLogger(__name__)


def exit_when_done(app: FastAPI, engine: Engine, reason: str) -> None:
    """--exit-when-done: once the run stopped, let the agents hear it and leave, then end the process.

    The server waits for the active workers to leave (at most
    ``EXIT_GRACE_SECONDS``) so they stop cleanly instead of finding it gone,
    and at least ``EXIT_LINGER_SECONDS``, so that agents still starting hear
    "the run is over" (410, exit 0) rather than find no server (exit 3);
    then it asks uvicorn to exit, and the lifespan's shutdown writes the
    summary and the models as on SIGTERM.
    """
    exit_now = getattr(app.state, "exit_now", None)
    if exit_now is None:
        log.warning("--exit-when-done: no server to stop (run under uvicorn directly?)")
        return
    log.info("run done (%s): exiting once the agents have left", reason)

    async def wait_then_exit() -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        while loop.time() < start + EXIT_LINGER_SECONDS or (
                engine.registry.active_ids() and loop.time() < start + EXIT_GRACE_SECONDS):
            await asyncio.sleep(0.1)
        exit_now()

    engine.on_loop(lambda: app.state.background.add(asyncio.ensure_future(wait_then_exit())))


# Longest an --exit-when-done server waits for its agents to leave after the run stopped.
EXIT_GRACE_SECONDS = 15.0
# Shortest: late agents (still importing torch when the run ended) register into a 410 meanwhile.
EXIT_LINGER_SECONDS = 5.0
