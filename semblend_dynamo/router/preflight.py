"""Start-up checks that turn Dynamo's long waits into one line naming the setting.

Dynamo's runtime waits about two minutes for an unreachable etcd (its default discovery backend) and then raises a
traceback; these checks take at most a few seconds and raise :class:`StartupError`, whose message names the
environment variable to fix.
"""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlparse

from ..config import ConfigError

DISCOVERY_BACKENDS = ("etcd", "kubernetes", "file", "mem")
DEFAULT_ETCD_ENDPOINTS = "http://localhost:2379"
CONNECT_TIMEOUT_S = 1.0


class StartupError(ConfigError):
    """The component cannot start as configured; the message (one line) names the setting.

    A :class:`ConfigError`, so every entry point (``semblend-dynamo router`` too) reports it as one line.
    """


def tcp_reachable(url: str, default_port: int, timeout: float = CONNECT_TIMEOUT_S) -> bool:
    """A TCP connect to the URL's host and port."""
    parsed = urlparse(url if "://" in url else f"tcp://{url}")
    try:
        with socket.create_connection((parsed.hostname or "127.0.0.1", parsed.port or default_port), timeout):
            return True
    except (OSError, ValueError):
        return False


def check_discovery(env: Mapping[str, str]) -> str:
    """The discovery backend Dynamo will use; :class:`StartupError` if it is unknown or cannot be reached."""
    backend = env.get("DYN_DISCOVERY_BACKEND", "").strip() or "etcd"
    if backend not in DISCOVERY_BACKENDS:
        raise StartupError(f"DYN_DISCOVERY_BACKEND={backend!r}: expected one of {', '.join(DISCOVERY_BACKENDS)}")
    if backend == "etcd":
        endpoints = env.get("ETCD_ENDPOINTS", "").strip() or DEFAULT_ETCD_ENDPOINTS
        if not any(tcp_reachable(e.strip(), 2379) for e in endpoints.split(",") if e.strip()):
            raise StartupError(
                f"etcd unreachable at ETCD_ENDPOINTS={endpoints} (DYN_DISCOVERY_BACKEND=etcd, Dynamo's default): "
                "start etcd, fix ETCD_ENDPOINTS, or set DYN_DISCOVERY_BACKEND=kubernetes|file"
            )
    elif backend == "kubernetes":
        if not env.get("KUBERNETES_SERVICE_HOST"):
            raise StartupError(
                "DYN_DISCOVERY_BACKEND=kubernetes outside a Kubernetes pod (KUBERNETES_SERVICE_HOST is not set)"
            )
    elif backend == "file":
        root = Path(env.get("DYN_FILE_KV", "").strip() or Path(tempfile.gettempdir()) / "dynamo_store_kv")
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StartupError(f"DYN_FILE_KV={root}: cannot create the discovery directory ({exc.strerror})") from None
        if not os.access(root, os.W_OK):
            raise StartupError(f"DYN_FILE_KV={root}: the discovery directory is not writable")
    return backend
