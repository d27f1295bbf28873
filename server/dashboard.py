"""The live view of a run: ``/ui`` (a page), ``/v1/history`` (its time series) and ``/docs`` served offline.

The page is static (``server/static/``, shipped as package data): vanilla
JavaScript that polls ``/v1/status``, ``/v1/workers`` and ``/v1/history`` and
draws its curves as inline SVG. Nothing is loaded from the internet, so it
works on an edge network with no way out; the same goes for ``/docs``,
whose Swagger UI files come from the ``fastapi-offline`` package when it is
installed (FastAPI's own page fetches them from a CDN and is blank offline).

The page itself is public, like ``/healthz``: it holds no data. Its data
endpoints are read endpoints, refused without a token under
``--protect-reads``; the page takes the token from a ``#token=...``
fragment (never sent to the server in the URL) or asks for it.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse

from hermes.server.engine.telemetry import Fields
from hermes.server.limits import errors
from hermes.server.tensorboard import TensorBoardSink

if TYPE_CHECKING:
    from hermes.server.engine import Engine
    from hermes.server.settings import ServerSettings

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).parent / "static"
# The page's own files, by name: nothing else under /ui/ is served (no path from a request touches the disk).
ASSETS = {"dashboard.js": "text/javascript", "dashboard.css": "text/css"}
SWAGGER_FILES = {"swagger-ui-bundle.js": "text/javascript", "swagger-ui.css": "text/css", "favicon.png": "image/png"}
# Points kept per series: an evaluation every 0.5 s fills it in ~30 min, and a
# poll that sends it all is ~200 kB; older points fall off the front.
DEFAULT_CAPACITY = 4096


def swagger_dir() -> Path | None:
    """The Swagger UI 5 files that ``fastapi-offline`` ships, or None where it is not installed."""
    spec = importlib.util.find_spec("fastapi_offline")
    if spec is None or spec.origin is None:
        return None
    static = Path(spec.origin).parent / "static"
    return static if all((static / name).is_file() for name in SWAGGER_FILES) else None


class History:
    """A bounded ring of the run's evaluations and training cycles, fed by ``Telemetry.subscribe``.

    Each point carries a sequence number, so a poller asks only for what it
    has not seen (``since``). ``emit`` runs on the event loop and in the
    evaluator's thread, hence the lock.
    """

    def __init__(self, name_of: Callable[[str], str], capacity: int = DEFAULT_CAPACITY) -> None:
        self.name_of = name_of
        self._lock = threading.Lock()
        self._seq = 0
        self.evaluations: deque[dict[str, Any]] = deque(maxlen=capacity)
        self.cycles: deque[dict[str, Any]] = deque(maxlen=capacity)

    def __call__(self, fact: str, fields: Fields) -> None:
        if fact == "evaluation":
            point = {"elapsed": fields["elapsed"], "version": fields["version"],
                     "accuracy": fields["accuracy"], "loss": fields["loss"],
                     # The task's metrics (r2, perplexity ...), when the evaluation has them.
                     **({"metrics": fields["metrics"]} if fields.get("metrics") else {})}
            target = self.evaluations
        elif fact == "cycle":
            wid = fields["worker"]
            point = {"elapsed": fields["elapsed"], "worker_id": wid, "worker": self.name_of(wid),
                     "compute_seconds": fields["compute_seconds"], "dss": fields["dss"], "batch_size": fields["batch_size"],
                     "pushed": fields["pushed"], "decision": fields["decision"], "z": fields["z"]}
            target = self.cycles
        else:
            return
        with self._lock:
            self._seq += 1
            target.append({"seq": self._seq, **point})

    def since(self, seq: int) -> dict[str, Any]:
        with self._lock:
            return {
                "seq": self._seq,
                "evaluations": [p for p in self.evaluations if p["seq"] > seq],
                "cycles": [p for p in self.cycles if p["seq"] > seq],
            }


def _offline_docs_page(openapi_url: str) -> str:
    """/docs without Swagger UI's files: the routes of the OpenAPI document, drawn by a few lines of JS."""
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>Hermes API</title>
<style>body{{font-family:sans-serif;margin:2em}}code{{background:#eee;padding:0 .3em}}</style></head>
<body><h1>Hermes parameter server API</h1>
<p>The full Swagger UI needs <code>pip install fastapi-offline</code>; the raw document is
<a href="{openapi_url}">{openapi_url}</a>.</p><ul id="paths"></ul>
<script>
fetch({openapi_url!r}).then(r => r.json()).then(doc => {{
  const ul = document.getElementById("paths");
  for (const [path, ops] of Object.entries(doc.paths)) for (const [method, op] of Object.entries(ops)) {{
    const li = document.createElement("li");
    li.textContent = method.toUpperCase() + " " + path + (op.summary ? " \u2014 " + op.summary : "");
    ul.appendChild(li);
  }}
}});
</script></body></html>"""


def _history(request: Request) -> History:
    return request.app.state.history


def build_router(readable: Callable[..., Any], openapi_url: str = "/openapi.json") -> APIRouter:
    """The routes of the live view; ``readable`` is the app's read guard (401 under protect_reads).

    The app's lifespan puts the run's ``History`` in ``app.state.history``.
    """
    router = APIRouter()
    swagger = swagger_dir()
    if swagger is None:
        log.info("fastapi-offline is not installed: /docs lists the routes of %s instead of Swagger UI",
                 openapi_url)

    @router.get("/ui", include_in_schema=False)
    def page() -> FileResponse:
        return FileResponse(STATIC_DIR / "dashboard.html", media_type="text/html",
                            headers={"Cache-Control": "no-cache"})

    @router.get("/ui/static/{name}", include_in_schema=False)
    def asset(name: str) -> FileResponse:
        if name in ASSETS:
            return FileResponse(STATIC_DIR / name, media_type=ASSETS[name], headers={"Cache-Control": "no-cache"})
        if swagger is not None and name in SWAGGER_FILES:
            return FileResponse(swagger / name, media_type=SWAGGER_FILES[name])
        raise HTTPException(404, f"no asset {name!r}")

    @router.get("/v1/history", responses=errors(401, 422))
    def history(since: int = Query(default=0, ge=0, description="only points after this sequence number"),
                _: Any = Depends(readable), hist: History = Depends(_history)) -> dict[str, Any]:
        """Evaluations (accuracy, loss) and training cycles (per worker) since ``since``, oldest first."""
        return hist.since(since)

    @router.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        if swagger is None:
            return HTMLResponse(_offline_docs_page(openapi_url))
        return get_swagger_ui_html(openapi_url=openapi_url, title="Hermes parameter server - API",
                                   swagger_js_url="/ui/static/swagger-ui-bundle.js",
                                   swagger_css_url="/ui/static/swagger-ui.css",
                                   swagger_favicon_url="/ui/static/favicon.png")

    return router


def watch_run(engine: Engine, settings: ServerSettings) -> tuple[History, TensorBoardSink | None]:
    """The readers of the run's facts besides the log and the metrics: /v1/history and TensorBoard."""
    def name_of(worker_id: str) -> str:
        rec = engine.registry.get(worker_id)
        return rec.name if rec is not None else worker_id

    history = History(name_of)
    engine.telemetry.subscribe(history)
    sink = None
    if settings.tensorboard_dir:
        def totals() -> tuple[int, int, int]:
            workers = engine.registry.all()
            return (sum(engine.message_counts.values()), sum(w.server_bytes_in for w in workers),
                    sum(w.server_bytes_out for w in workers))

        try:
            sink = TensorBoardSink(settings.tensorboard_dir, name_of=name_of, totals=totals)
        except OSError as exc:  # hermes-server checks first; the uvicorn factory path meets it here
            log.error("cannot start: tensorboard_dir %s: %s", settings.tensorboard_dir, exc)
            engine.events.close()
            raise
        engine.telemetry.subscribe(sink)
    return history, sink
