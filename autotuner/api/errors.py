"""Domain errors to HTTP errors, with one body shape per kind.

- 422 (bad input): ``{"detail": [{"loc": [...], "msg": "...", "type": "..."}]}``, as
  FastAPI's own validation errors; ``loc`` starts with ``body``, ``query`` or ``path``.
- Every other error: ``{"detail": "...", "field": "..."}`` (``field`` when one is to blame).

A client's input never gets a 5xx; storage trouble gets 503; anything else is our bug (500).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, ValidationError
from sqlalchemy import exc as sa_exc

from autotuner.errors import AutotunerError, ExportError, JobBusyError, SpecError
from autotuner.spec import error_loc, error_msg
from autotuner.verl_check import VerlRejectedError
from storage import (
    DatabaseUnavailableError,
    JobNotFoundError,
    JobStateError,
    SchemaNotReadyError,
    StorageError,
)

log = logging.getLogger(__name__)

Loc = list[str | int]


class ApiError(AutotunerError):
    """Raised by the service for an outcome with an HTTP status of its own."""

    status_code = 400

    def __init__(self, message: str, field: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message, self.field, self.headers = message, field, headers


class NotFoundError(ApiError):
    """Raised when a job, a trial or a best trial does not exist."""

    status_code = 404


class ConflictError(ApiError):
    """Raised when the resource's state forbids the request (export of a config-less trial)."""

    status_code = 409


class UnauthorizedError(ApiError):
    """Raised when the bearer token is missing or wrong."""

    status_code = 401


class UnsupportedMediaTypeError(ApiError):
    """Raised when a body comes in a format the endpoint does not read."""

    status_code = 415


class InvalidInputError(AutotunerError):
    """Raised when a request's content is invalid; carries FastAPI-shaped error items."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors))
        self.errors = errors

    @classmethod
    def at(cls, loc: Loc, message: str, kind: str = "value_error") -> InvalidInputError:
        return cls([{"loc": loc, "msg": message, "type": kind}])

    @classmethod
    def from_validation(cls, exc: ValidationError, prefix: Loc) -> InvalidInputError:
        items = []
        for err in exc.errors(include_url=False, include_input=False):
            loc = error_loc(err)
            items.append({"loc": [*prefix, *loc], "msg": error_msg(err), "type": err["type"]})
        return cls(items)


class ErrorPublic(BaseModel):
    """The body of every error but 422: what went wrong and, when one is to blame, the field."""

    detail: str = Field(description="What went wrong and what to change.")
    field: str | None = Field(default=None, description="The input to blame, if one is.")


def _error(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorPublic"}}},
    }


_VALIDATION = {
    "description": "Invalid input: each item names the field (loc) and why",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/HTTPValidationError"}}},
}


def document(schema: dict[str, Any]) -> None:
    """Add the error responses each operation of the OpenAPI ``schema`` can give (FastAPI
    only lists 422): 401 where the bearer token applies, 404 for a job's paths, 409 where
    the job's state may forbid the request, 503 wherever the database is read."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components["ErrorPublic"] = ErrorPublic.model_json_schema()
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            responses = operation.setdefault("responses", {})
            extra: dict[str, Any] = {}
            if operation.get("security"):
                extra["401"] = _error("Missing or wrong bearer token (Authorization header)")
            if "{job_id}" in path:
                extra["404"] = _error("No such job (or trial)")
            if method in ("post", "delete") and "{job_id}" in path or path.endswith("/config"):
                extra["409"] = _error("The job's or trial's state forbids this")
            if path.startswith("/v1/jobs") or path == "/healthz":
                extra["503"] = _error("The database is unavailable; retry after Retry-After s")
            if method == "post" and path == "/v1/jobs":
                extra["400"] = _error("Malformed Content-Length")
                extra["422"] = _VALIDATION
            for code, response in extra.items():
                responses.setdefault(code, response)


def _body(detail: Any, field: str | None = None) -> dict[str, Any]:
    return {"detail": detail} if field is None else {"detail": detail, "field": field}


def spec_error_loc(error: SpecError, search_keys: list[str]) -> Loc:
    """``search.<knob path>.choices`` -> ["body", "search", "<knob path>", "choices"]: a knob
    path has dots of its own, so it stays one element, as in pydantic's locations."""
    field = error.field
    if field.startswith("(") or not field:
        return ["body"]
    if field.startswith("search."):
        rest = field.removeprefix("search.")
        for key in sorted(search_keys, key=len, reverse=True):
            if rest == key or rest.startswith(key + "."):
                tail = rest[len(key) + 1 :]
                return ["body", "search", key, *([tail] if tail else [])]
    return ["body", *field.split(".")]


def install(app: FastAPI) -> None:
    """Register the handlers that give every error its body and status."""

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        items = [
            {"loc": list(e["loc"]), "msg": e["msg"].removeprefix("Value error, "), "type": e["type"]}
            for e in exc.errors()
        ]
        return JSONResponse(_body(items), status_code=422)

    @app.exception_handler(InvalidInputError)
    async def _invalid(request: Request, exc: InvalidInputError) -> JSONResponse:
        return JSONResponse(_body(exc.errors), status_code=422)

    @app.exception_handler(ApiError)
    async def _api(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(_body(exc.message, exc.field), status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(JobNotFoundError)
    async def _job_not_found(request: Request, exc: JobNotFoundError) -> JSONResponse:
        return JSONResponse(_body(str(exc), "job_id"), status_code=404)

    @app.exception_handler(JobStateError)
    async def _job_state(request: Request, exc: JobStateError) -> JSONResponse:
        return JSONResponse(_body(str(exc)), status_code=409)

    @app.exception_handler(JobBusyError)
    async def _job_busy(request: Request, exc: JobBusyError) -> JSONResponse:
        return JSONResponse(_body(str(exc)), status_code=409)

    @app.exception_handler(VerlRejectedError)
    async def _verl_rejected(request: Request, exc: VerlRejectedError) -> JSONResponse:
        # The config (the trial the path names) is what verl refuses: a 422 naming verl's words.
        item = {"loc": ["path", "number"], "msg": str(exc), "type": "verl_rejected"}
        return JSONResponse({"detail": [item]}, status_code=422)

    @app.exception_handler(ExportError)
    async def _export(request: Request, exc: ExportError) -> JSONResponse:
        return JSONResponse(_body(str(exc)), status_code=409)

    @app.exception_handler(StorageError)
    async def _storage(request: Request, exc: StorageError) -> JSONResponse:
        if not isinstance(exc, (DatabaseUnavailableError, SchemaNotReadyError)):
            log.error("storage error on %s %s: %s", request.method, request.url.path, exc)
        return JSONResponse(
            _body(f"storage unavailable: {exc}"), status_code=503, headers={"Retry-After": "5"}
        )

    @app.exception_handler(sa_exc.OperationalError)
    async def _driver(request: Request, exc: sa_exc.OperationalError) -> JSONResponse:
        # Optuna's storage (the trials) talks to the database without our error mapping.
        log.error("database error on %s %s: %s", request.method, request.url.path, exc.orig)
        return JSONResponse(
            _body(f"storage unavailable: {type(exc.orig).__name__}: {exc.orig}"),
            status_code=503,
            headers={"Retry-After": "5"},
        )
