"""The router's HTTP side door: ``/metrics`` (Prometheus), ``/healthz`` and ``/debug/donors``.

A minimal HTTP/1.0 server on the router's event loop, so handlers read router state without locks.
``/healthz`` answers 200 with ``{"status": "ok"}`` or ``{"status": "degraded", ...}`` (NATS down: the
router still routes, exact-only) and 503 only while the router cannot serve requests (starting or
stopped), so a liveness probe never restarts a router that is merely degraded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

log = logging.getLogger(__name__)

_MAX_REQUEST_BYTES = 8192


class HealthStatus(BaseModel):
    """What ``/healthz`` reports."""

    status: str  # ok | degraded | starting | stopped
    serving: bool
    nats_connected: bool
    event_plane: str
    reasons: list[str] = []
    donors: int = 0
    workers: int = 0


class HealthServer:
    """Serves the three paths from callables evaluated per request on the event loop."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        health: Callable[[], HealthStatus],
        metrics: Callable[[], bytes],
        donors: Callable[[], list[dict[str, Any]]],
    ) -> None:
        self.host = host
        self.port = port
        self._health = health
        self._metrics = metrics
        self._donors = donors
        self._server: asyncio.base_events.Server | None = None

    async def start(self) -> int:
        """Bind and serve; returns the bound port (useful with port 0)."""
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = int(self._server.sockets[0].getsockname()[1])
        log.info("metrics/health on http://%s:%d", self.host, self.port)
        return self.port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
            if len(head) > _MAX_REQUEST_BYTES:
                raise ValueError("request too large")
            method, path, _ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
            code, ctype, body = self._route(method, path.split("?", 1)[0])
        except Exception:
            code, ctype, body = 400, "text/plain", b"bad request\n"
        reason = {
            200: "OK",
            400: "Bad Request",
            404: "Not Found",
            405: "Method Not Allowed",
            503: "Service Unavailable",
        }
        writer.write(
            f"HTTP/1.0 {code} {reason.get(code, '')}\r\nContent-Type: {ctype}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        with contextlib.suppress(Exception):
            await writer.drain()
            writer.close()

    def _route(self, method: str, path: str) -> tuple[int, str, bytes]:
        if method != "GET":
            return 405, "text/plain", b"GET only\n"
        if path == "/metrics":
            return 200, "text/plain; version=0.0.4; charset=utf-8", self._metrics()
        if path in ("/healthz", "/health", "/readyz"):
            status = self._health()
            return (200 if status.serving else 503), "application/json", status.model_dump_json().encode()
        if path == "/debug/donors":
            return 200, "application/json", json.dumps(self._donors()).encode()
        return 404, "text/plain", b"not found\n"
