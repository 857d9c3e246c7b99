"""What queueing a sync's peer donors for the indexer costs a donor on the catalog's thread: one call (one lock, one
wake-up of the indexer thread) per donor against one per chunk of 2,048 (``PipelineIndexer.add_peers``), the indexer
held as during a sync, 300K donors, three rounds.

    python benchmarks/results/session22/queue_adds.py
"""

from __future__ import annotations

import logging
import time

import numpy as np

from semblend_dynamo.router.indexer import PipelineIndexer

logging.disable(logging.WARNING)  # close() reports the changes it never applied


class NoDiscovery:
    index = None

    def register_embeddings(self, *_: object) -> list[str]:
        return []


class Peer:
    __slots__ = ("donor_id", "namespace")

    def __init__(self, i: int) -> None:
        self.donor_id, self.namespace = f"d{i}", "ns"

    def vector(self) -> np.ndarray:
        return np.zeros(4, np.float32)


for rnd in range(3):
    for mode in ("one call a donor", "one call a chunk"):
        indexer = PipelineIndexer(NoDiscovery(), lambda _: None, max_pending=10**7)  # type: ignore[arg-type]
        indexer.hold(True)
        donors = [Peer(i) for i in range(300_000)]
        started = time.perf_counter()
        if mode == "one call a chunk":
            for k in range(0, len(donors), 2048):
                indexer.add_peers(donors[k : k + 2048])
        else:
            for donor in donors:
                indexer.add_peers([donor])
        print(f"round {rnd}, {mode}: {(time.perf_counter() - started) / len(donors) * 1e6:.2f} us a donor")
        indexer.close(0)
