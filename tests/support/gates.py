"""Request-gate test doubles for the router's background steps."""

from __future__ import annotations

from semblend_dynamo.router.indexer import RequestGate


class GateDecidingAfterFirstWait(RequestGate):
    """A request gate on which a decision starts right after the first background step passed it (a request that
    arrives while a background thread hashes)."""

    def __init__(self) -> None:
        super().__init__(max_wait_s=30)
        self.waits = 0
        self.deciding_now = self.deciding()

    def wait(self) -> None:
        self.waits += 1
        if self.waits == 1:
            self.deciding_now.__enter__()
            return
        super().wait()
