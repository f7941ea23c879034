"""/v1/jobs: submit, list, watch, cancel and delete jobs; their trials, front and configs."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Header, Path, Query, Request, Response
from fastapi.concurrency import run_in_threadpool

from autotuner.api.schemas import (
    JobCreated,
    JobPublic,
    ObjectivePublic,
    Page,
    ParetoPointPublic,
    ParetoPublic,
    TrialPublic,
)
from autotuner.api.security import require_read, require_write
from autotuner.api.service import JobService, JobView
from autotuner.api.submission import JSON_TYPES, YAML_TYPES
from autotuner.records import TrialStatus
from storage import JobStatus

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], dependencies=[Depends(require_read)])

JobId = Annotated[str, Path(description="The job's id.")]
TrialNumber = Annotated[int, Path(ge=0, le=10_000_000, description="The trial's number.")]
Offset = Annotated[int, Query(ge=0, le=1_000_000_000, description="Items to skip.")]
Limit = Annotated[int, Query(ge=1, le=1000, description="Items to return at most.")]
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        description="A fresh key (e.g. a UUID) per new job; a retry sends the same key and body "
        "and gets the job the first request created.",
    ),
]

_SPEC_BODY = {"schema": {"$ref": "#/components/schemas/JobCreate"}}
_SUBMIT_BODY = {
    "requestBody": {
        "required": True,
        "description": "A job spec; YAML with Content-Type application/yaml (or text/yaml).",
        "content": {media: _SPEC_BODY for media in JSON_TYPES + YAML_TYPES},
    }
}


def _service(request: Request) -> JobService:
    service: JobService = request.app.state.service
    return service


Service = Annotated[JobService, Depends(_service)]


def public_job(request: Request, view: JobView, listed: bool = False) -> JobPublic:
    """The job as the API shows it (the web page shows the same)."""
    url = str(request.url_for("get_job", job_id=view.job.id))
    return JobPublic.of(
        view.job,
        url,
        view.records,
        view.best,
        spec=view.spec,
        picked_by=view.picked_by,
        verl=view.verified,
        listed=listed,
        verdicts=view.verl,
    )


@router.post(
    "",
    status_code=201,
    response_model=JobCreated,
    openapi_extra=_SUBMIT_BODY,
    dependencies=[Depends(require_write)],
    responses={
        200: {"model": JobCreated, "description": "A repeat of an earlier submission: its job"},
        409: {"description": "The Idempotency-Key was used before with another body"},
        413: {"description": "Body too large"},
        415: {"description": "Not JSON or YAML"},
    },
)
async def submit_job(
    request: Request, response: Response, service: Service, idempotency_key: IdempotencyKey = None
) -> JobCreated:
    """Queue a job. It is validated now (spec, caps, model, search space); nothing is stored
    when it is refused. With an ``Idempotency-Key`` header, a retry of the same request (same
    key, same body) returns the job the first one created, with 200: a client that timed
    out may retry without creating a second job."""
    body = await request.body()
    job, created = await run_in_threadpool(
        service.submit, body, request.headers.get("content-type"), idempotency_key
    )
    if not created:
        response.status_code = 200
    url = str(request.url_for("get_job", job_id=job.id))
    response.headers["Location"] = url
    return JobCreated(id=job.id, url=url, status=job.status)  # type: ignore[arg-type]


@router.get("", response_model=Page[JobPublic])
def list_jobs(
    request: Request, service: Service, status: JobStatus | None = None, offset: Offset = 0, limit: Limit = 50
) -> Page[JobPublic]:
    """Jobs, newest first, each without its spec (GET the job for it)."""
    views, count = service.list_jobs(status, offset, limit)
    return Page[JobPublic](data=[public_job(request, v, listed=True) for v in views], count=count)


@router.get("/{job_id}", response_model=JobPublic)
def get_job(request: Request, job_id: JobId, service: Service) -> JobPublic:
    """Status, trials done/total, the best trial so far, elapsed time and ETA."""
    return public_job(request, service.get_job(job_id))


@router.post("/{job_id}/cancel", response_model=JobPublic, dependencies=[Depends(require_write)])
def cancel_job(request: Request, job_id: JobId, service: Service) -> JobPublic:
    """Cancel: a queued job at once; a running one stops its trials and keeps what it measured."""
    return public_job(request, service.cancel_job(job_id))


@router.delete("/{job_id}", status_code=204, dependencies=[Depends(require_write)])
def delete_job(job_id: JobId, service: Service) -> Response:
    """Delete a job that is not running, with its trials."""
    service.delete_job(job_id)
    return Response(status_code=204)


@router.get("/{job_id}/trials", response_model=Page[TrialPublic])
def list_trials(
    job_id: JobId,
    service: Service,
    status: TrialStatus | None = None,
    offset: Offset = 0,
    limit: Limit = 1000,
) -> Page[TrialPublic]:
    """Trials in order, with every metric each one measured."""
    recs, count, runs, verl = service.trials(job_id, status, offset, limit)
    return Page[TrialPublic](
        data=[TrialPublic.of(r, runs.get(r.number), verl.get(r.number)) for r in recs], count=count
    )


@router.get("/{job_id}/pareto", response_model=ParetoPublic)
def pareto(job_id: JobId, service: Service) -> ParetoPublic:
    """The feasible trials no other feasible trial beats on every objective of the job."""
    spec, points, runs = service.pareto(job_id)
    metrics = [o.metric for o in spec.objectives]
    return ParetoPublic(
        data=[ParetoPointPublic.of(r, metrics, runs.get(r.number)) for r in points],
        count=len(points),
        objectives=[
            ObjectivePublic(metric=o.metric, direction=o.resolved_direction)  # type: ignore[arg-type]
            for o in spec.objectives
        ],
    )


@router.get("/{job_id}/best", response_model=TrialPublic)
def best_trial(
    job_id: JobId,
    service: Service,
    max_peak_memory_gib: Annotated[
        float | None,
        Query(gt=0, allow_inf_nan=False, description="Only trials whose peak memory is at most this."),
    ] = None,
) -> TrialPublic:
    """The winner under a peak-memory cap if given: the fastest feasible trial, or once the
    finalists were re-measured the best median (ties within the noise band: least memory)."""
    return TrialPublic.of(*service.best_trial(job_id, max_peak_memory_gib))


@router.get("/{job_id}/trials/{number}", response_model=TrialPublic)
def get_trial(job_id: JobId, number: TrialNumber, service: Service) -> TrialPublic:
    """One trial."""
    view, rec = service.trial(job_id, number)
    return TrialPublic.of(rec, view.runs.get(rec.number), view.verified.get(rec.number))


@router.get(
    "/{job_id}/trials/{number}/config",
    response_class=Response,
    responses={
        200: {
            "content": {"application/yaml": {}, "text/plain": {}},
            "description": "The trial's verl config, as a download.",
        }
    },
)
def trial_config(
    job_id: JobId, number: TrialNumber, service: Service, format: Literal["yaml", "overrides"] = "yaml"
) -> Response:
    """The trial's verl config: nested YAML, or Hydra override lines."""
    file = service.export_config(job_id, number, format)
    return Response(
        file.text,
        media_type=file.media_type,
        headers={"Content-Disposition": f'attachment; filename="{file.filename}"'},
    )
