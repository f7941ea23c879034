"""The bearer token: required for every write once a token is set, and for reads too when
the service is bound to a non-loopback address (where Settings insists on a token).

Tokens are compared as UTF-8 bytes, in constant time, and never logged.
"""

from __future__ import annotations

import hmac

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from autotuner.api.errors import UnauthorizedError
from autotuner.settings import Settings

bearer = HTTPBearer(auto_error=False, description="The service's AUTOTUNER_API_TOKEN.")
_CHALLENGE = {"WWW-Authenticate": "Bearer"}


def _check(settings: Settings, credentials: HTTPAuthorizationCredentials | None) -> None:
    if settings.api_token is None:
        return
    if credentials is None:
        raise UnauthorizedError(
            "missing bearer token: send the header 'Authorization: Bearer <token>' with the "
            "service's AUTOTUNER_API_TOKEN",
            field="Authorization",
            headers=_CHALLENGE,
        )
    # The server reads header bytes as Latin-1: back to those bytes, compared with the token's
    # UTF-8 (what a client sends for a non-ASCII token).
    given = credentials.credentials.encode("latin-1", errors="replace")
    if not hmac.compare_digest(given, settings.api_token.get_secret_value().encode("utf-8")):
        raise UnauthorizedError(
            "wrong bearer token: the Authorization header does not carry the service's AUTOTUNER_API_TOKEN",
            field="Authorization",
            headers=_CHALLENGE,
        )


def require_write(
    request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(bearer)
) -> None:
    """A write needs the token whenever one is set."""
    _check(request.app.state.settings, credentials)


def require_read(
    request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(bearer)
) -> None:
    """A read needs the token when the service is reachable from other hosts."""
    settings: Settings = request.app.state.settings
    if not settings.loopback_bind:
        _check(settings, credentials)
