"""Fixtures shared by the router tests that run a real local graph (nats-server, Dynamo workers, routers)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.router.cluster import Cluster
from tests.support.nats import nats_binary


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """One graph per test module: its own nats-server and processes, all closed after the module."""
    if nats_binary() is None:
        pytest.fail("nats-server is missing: scripts/bootstrap.sh dev installs it")
    c = Cluster()
    try:
        yield c
    finally:
        c.close()
