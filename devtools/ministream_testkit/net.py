"""Loopback networking for the test servers: a free port, and whether a URL answers."""

from __future__ import annotations

import socket

import httpx


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def accepts(port: int) -> bool:
    """Whether something listens on 127.0.0.1:`port`."""
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def answers(url: str, status: int = 200, timeout: float = 2) -> bool:
    """Whether a GET of `url` answers `status` (False while nothing listens there)."""
    try:
        return httpx.get(url, timeout=timeout).status_code == status
    except httpx.HTTPError:
        return False
