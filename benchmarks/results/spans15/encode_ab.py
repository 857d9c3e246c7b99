"""The hint's encoding (``EvidencePublisher.encode``: what ``send_first`` does before the socket write) and the hint's
construction, µs per call (best of 5 x 20,000), in the tree given: an 8-span ``DonorHint`` as the router builds one.
Run it on two trees in turns.

Usage: ``python benchmarks/results/spans15/encode_ab.py TREE``
"""

import sys
import timeit

TREE = sys.argv[1]
sys.path.insert(0, TREE)

from semblend_dynamo.config import SemblendConfig  # noqa: E402
from semblend_dynamo.events.link import NatsLink  # noqa: E402
from semblend_dynamo.events.publisher import EvidencePublisher  # noqa: E402
from semblend_dynamo.events.schemas import DonorHint  # noqa: E402
from semblend_dynamo.outcomes import Outcome  # noqa: E402

FIELDS = dict(
    request_key="0123456789abcdef",
    request_id="0f1e2d3c4b5a69788796a5b4c3d2e1f0",
    donor_id="d123",
    donor_key="fedcba9876543210",
    worker_id=0x1234_5678_9ABC,
    dp_rank=0,
    namespace="0011223344556677",
    similarity=None,
    spans=[(0, 2048 + 512 * k, 512) for k in range(8)],
    decision=Outcome.SEMANTIC_PLACEMENT,
    trace_id="abcdef0123456789",
)
publisher = EvidencePublisher(NatsLink(SemblendConfig(), name="encode-ab"), queue_size=16)
hint = DonorHint(**FIELDS)
for name, call in (("encode", lambda: publisher.encode(hint)), ("DonorHint(...)", lambda: DonorHint(**FIELDS))):
    best = min(timeit.repeat(call, number=20_000, repeat=5)) / 20_000 * 1e6
    print(f"{name}: {best:.2f} us ({len(publisher.encode(hint))} bytes)")
