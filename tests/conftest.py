from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.support.nats import NatsServer, nats_binary

os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture()
def nats_server() -> Iterator[NatsServer]:
    """A fresh nats-server on a free loopback port, stopped after the test."""
    if nats_binary() is None:
        pytest.fail("nats-server is missing: scripts/bootstrap.sh dev installs it")
    with NatsServer() as server:
        yield server
