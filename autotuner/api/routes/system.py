"""/healthz and /v1/hardware."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from autotuner.api.schemas import HardwarePublic, HealthPublic
from autotuner.api.security import require_read
from autotuner.api.service import JobService

router = APIRouter(tags=["system"])


@router.get("/healthz", response_model=HealthPublic)
def healthz(request: Request) -> HealthPublic:
    """Liveness and readiness: 200 when the database answers, 503 when it does not."""
    service: JobService = request.app.state.service
    service.ping()
    runner = request.app.state.runner
    return HealthPublic(
        status="ok",
        database=service.ctx.database.dialect,
        runner="running" if runner.alive else "stopped",
        jobs_running=len(runner.running()),
    )


@router.get("/v1/hardware", response_model=HardwarePublic, dependencies=[Depends(require_read)])
def hardware(request: Request) -> HardwarePublic:
    """The resources the Ray cluster offers, and the GPUs of the service's own host."""
    service: JobService = request.app.state.service
    return HardwarePublic.model_validate(service.hardware())
