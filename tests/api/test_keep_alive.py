"""The server keeps an idle connection open longer than its clients keep theirs, so that a
request a client sends on a connection it still holds never meets the server closing it."""

from __future__ import annotations

import re
import socket
import time
from urllib.parse import urlparse

import httpx

from autotuner.cli import KEEP_ALIVE_S

from .conftest import Server


def _get(sock: socket.socket, host: str) -> bytes:
    """GET /healthz on ``sock``: the response's head, b"" if the server closed the socket."""
    sock.sendall(f"GET /healthz HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return b""
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    found = re.search(rb"content-length: (\d+)", head, re.IGNORECASE)
    length = int(found.group(1)) if found else 0
    while len(body) < length:
        body += sock.recv(65536)
    return head


def test_an_idle_connection_outlives_a_clients_own_keep_alive(server: Server) -> None:
    expiry = httpx.Limits().keepalive_expiry or 0.0  # httpx drops idle connections after this
    assert expiry + 5 < KEEP_ALIVE_S
    url = urlparse(server.url)
    assert url.hostname and url.port
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        assert _get(sock, url.netloc).startswith(b"HTTP/1.1 200")
        time.sleep(expiry + 1)  # idle past what a client keeps; uvicorn's default (5 s) closes it
        assert _get(sock, url.netloc).startswith(b"HTTP/1.1 200")  # the same connection answers
