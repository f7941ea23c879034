"""The FastAPI app: routes under /v1, docs at /docs (Swagger UI) and /redoc, served from
local files (no CDN), and a lifespan that owns the database, Ray and the job runner."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi_offline import FastAPIOffline

from autotuner import __version__
from autotuner.api import errors, web
from autotuner.api.hosts import HostCheck
from autotuner.api.limits import BodySizeLimit
from autotuner.api.routes import jobs, system
from autotuner.api.schemas import JobCreate
from autotuner.api.service import JobService
from autotuner.jobs import JobContext
from autotuner.runner import JobRunner
from autotuner.settings import Settings, get_settings

log = logging.getLogger(__name__)

DESCRIPTION = """Submit verl autotuning jobs, watch them, browse the Pareto front
(throughput against peak memory) and download the chosen trial as a verl config.

Writes need `Authorization: Bearer <AUTOTUNER_API_TOKEN>` when the service has a token;
reads too when it listens on a non-loopback address."""


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Open the database, start Ray here (the main thread), then the runner; on the way
    out stop the runner (running jobs go back to the queue) and Ray."""
    import ray

    from autotuner.executor import ensure_ray

    settings: Settings = app.state.settings
    # The token lives in the settings; no child process (Ray's, the trials', an engine's)
    # inherits it through the environment, where a crash dump or a log could show it.
    os.environ.pop("AUTOTUNER_API_TOKEN", None)
    ctx = JobContext.open(settings)
    started_ray = not ray.is_initialized()
    with _signal_handlers_kept():
        ensure_ray(settings.ray_address, settings.ray_num_cpus)
    service = JobService(ctx)
    runner = JobRunner(ctx, settings.runner_concurrency, orphan_check_s=max(1.0, settings.orphan_after_s / 2))
    app.state.service, app.state.runner = service, runner
    runner.start()
    log.info(
        "autotuner API ready: database %s, %d job(s) at once",
        ctx.database.masked_url,
        settings.runner_concurrency,
    )
    try:
        yield
    finally:
        runner.stop()
        service.close()
        if started_ray:
            ray.shutdown()
        ctx.database.dispose()


@contextmanager
def _signal_handlers_kept() -> Iterator[None]:
    """Keep the server's SIGTERM/SIGINT handlers: ``ray.init`` replaces SIGTERM's with one
    that exits at once, which would skip the lifespan's clean shutdown."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    kept = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in kept.items():
            if handler is not None:
                signal.signal(sig, handler)


def create_app(settings: Settings | None = None) -> FastAPI:
    """The service for ``settings`` (default: the environment's). Nothing starts until the
    app's lifespan runs (uvicorn, or ``fastapi.testclient.TestClient`` as a context)."""
    app = FastAPIOffline(
        title="autotuner",
        version=__version__,
        description=DESCRIPTION,
        lifespan=_lifespan,
        docs_url="/docs",
        redoc_url="/redoc",
        static_url="/docs-static",
    )
    app.state.settings = settings or get_settings()
    app.add_middleware(BodySizeLimit, max_bytes=app.state.settings.max_request_bytes)
    app.add_middleware(HostCheck, settings=app.state.settings)  # added last: runs first
    errors.install(app)
    app.include_router(system.router)
    app.include_router(jobs.router)
    app.include_router(web.router)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's schema, plus JobCreate: POST /v1/jobs reads its body itself (JSON or YAML)."""
    if app.openapi_schema is None:
        schema = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes
        )
        job_create = JobCreate.model_json_schema(ref_template="#/components/schemas/{model}")
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for name, definition in job_create.pop("$defs", {}).items():
            components.setdefault(name, definition)
        components["JobCreate"] = job_create
        errors.document(schema)
        app.openapi_schema = schema
    return app.openapi_schema
