"""The Host header checked against the names this service answers to.

A page on another site can point its own DNS name at 127.0.0.1 (DNS rebinding) and have
the browser call the service as a "same-origin" request; the browser still sends that
site's name as the Host. So a request is served only when its Host is the bind address,
a loopback name while bound to loopback, or a name in ``AUTOTUNER_ALLOWED_HOSTS``.
Bound to every interface (0.0.0.0, ::) with no names configured, any Host is served:
there the token is required for every request (``Settings``), which no rebinding page has.
"""

from __future__ import annotations

import ipaddress

from starlette.types import ASGIApp, Receive, Scope, Send

from autotuner.api.limits import header, reply
from autotuner.settings import Settings

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARD_BINDS = frozenset({"0.0.0.0", "::", ""})


def allowed_hosts(settings: Settings) -> frozenset[str] | None:
    """The host names (lower case, no port) requests may carry; None: any."""
    names = {name.strip().lower().strip("[]") for name in settings.allowed_hosts if name.strip()}
    if "*" in names or (settings.host in WILDCARD_BINDS and not names):
        return None
    names.add(settings.host.lower().strip("[]"))
    if settings.loopback_bind or settings.host in WILDCARD_BINDS:
        names |= LOOPBACK_NAMES
    return frozenset(names)


def host_name(value: str) -> str:
    """``example.org:8000`` -> ``example.org``; ``[::1]:8000`` -> ``::1``."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:].split("]", 1)[0]
    if value.count(":") > 1:  # a bare IPv6 address
        try:
            return str(ipaddress.ip_address(value))
        except ValueError:
            return value
    return value.rsplit(":", 1)[0] if ":" in value else value


class HostCheck:
    """ASGI middleware: 400 for an HTTP request whose Host names another site."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.allowed = allowed_hosts(settings)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.allowed is None:
            await self.app(scope, receive, send)
            return
        given = header(scope, b"host")
        if given is not None and host_name(given) not in self.allowed:
            await reply(
                send,
                400,
                f"Host {given[:200]!r} is not a name this service answers to; add it to "
                "AUTOTUNER_ALLOWED_HOSTS (a JSON list of host names) if it is one of this service's",
                "Host",
            )
            return
        await self.app(scope, receive, send)
