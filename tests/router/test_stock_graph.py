"""End to end on Dynamo's own parts, on each event plane: nats-server, ``dynamo.frontend`` (OpenAI HTTP) -> the
SemBlend router (found through its model card) -> three ``dynamo.mocker --engine-type trtllm`` workers, whose
KV events (stored/removed, published by Dynamo's own publisher) are the router's only source of residency.

Routing is observed through the router's own records (``RouteEvidence`` on NATS, ``/debug/donors``) and the
mockers' own reuse report (``usage.prompt_tokens_details.cached_tokens``). Dynamo's own ``--router-mode kv``
Frontend on the workers' namespace answers ``query_instance_id`` (its choice, without running the request) for
the comparison. Tests of one module run in order on one graph per event plane.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from semblend_dynamo.events.schemas import RouteEvidence
from semblend_dynamo.outcomes import Outcome
from tests.support.dynamo_graph import MODEL, DynamoGraph, EvidenceTap, Frontend, wait_until
from tests.support.nats import nats_binary

pytestmark = [pytest.mark.nats, pytest.mark.dynamo]

GPU_BLOCKS = 256
"""Per mocker (4096 tokens): one long document evicts most of a worker's cache."""
SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]


def document(seed: int, words: int) -> str:
    """A text of made-up words from a 70-syllable alphabet: documents of different seeds share no spans."""
    rng = random.Random(seed)
    out = []
    for i in range(words):
        word = "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3)))
        out.append(word + ("." if i % 10 == 9 else ""))
    return " ".join(out)


@dataclass
class Stock:
    graph: DynamoGraph
    semblend: Frontend
    dynamo_kv: Frontend
    tap: EvidenceTap

    def send(self, prompt: str) -> tuple[RouteEvidence, dict]:
        """One request through the SemBlend Frontend; the router's evidence for it and the HTTP response."""
        seen = self.tap.count()
        response = self.semblend.complete(prompt)
        return self.tap.next_after(seen), response

    def dynamo_choice(self, prompt: str) -> int:
        """The worker Dynamo's own KV router would pick now (``query_instance_id``: the request is not run)."""
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 2, "nvext": {"annotations": ["query_instance_id:"]}}
        response = self.dynamo_kv.post("/v1/completions", body)
        return int(response["nvext"]["worker_id"]["decode_worker_id"])

    def donors(self) -> list[dict]:
        return list(self.graph.router_get("/debug/donors"))

    def resident_donor(self, worker_id: int, blocks: int) -> dict | None:
        """A resident donor of ``blocks`` blocks on ``worker_id`` (the request just served), once it exists."""
        for donor in self.donors():
            if donor["worker_id"] == worker_id and donor["blocks"] == blocks and donor["resident"]:
                # the discovery pipeline follows the catalog on the router's indexer thread
                return donor if self.graph.router_metric("semblend_router_indexer_backlog") == 0 else None
        return None


@pytest.fixture(scope="module", params=["zmq", "nats"])
def stock(request: pytest.FixtureRequest) -> Iterator[Stock]:
    if nats_binary() is None:
        pytest.fail("nats-server is missing: scripts/bootstrap.sh dev installs it")
    graph = DynamoGraph(request.param)
    tap = None
    try:
        for _ in range(3):
            graph.start_mocker(gpu_blocks=GPU_BLOCKS)
        graph.start_router()
        semblend = graph.start_frontend()
        dynamo_kv = graph.start_frontend(router_mode="kv", namespace=graph.worker_ns)
        tap = EvidenceTap(graph.nats.url, graph.evidence_subject())
        yield Stock(graph, semblend, dynamo_kv, tap)
    finally:
        if tap is not None:
            tap.close()
        graph.close()


def _blocks(evidence: RouteEvidence) -> int:
    return evidence.prompt_tokens // 16


def test_exact_repeat_routes_as_exact_prefix_match(stock: Stock) -> None:
    prompt = "Summarize the report.\n\n" + document(1, 300)
    first, _ = stock.send(prompt)
    assert first.worker_id is not None
    wait_until(lambda: stock.resident_donor(first.worker_id, _blocks(first)), what="donor resident from KV events")
    again, response = stock.send(prompt)
    assert again.outcome == Outcome.EXACT_PREFIX_ROUTE and again.decline_reason == "exact_prefix_wins"
    assert again.hint is None
    assert again.worker_id == first.worker_id
    assert again.exact_overlap_blocks == _blocks(first)
    assert response["usage"]["prompt_tokens_details"]["cached_tokens"] >= 16 * again.exact_overlap_blocks - 16


def test_reframed_document_is_placed_on_the_donors_worker(stock: Stock) -> None:
    doc = document(2, 350)
    donor, _ = stock.send("You are a careful analyst. Read the filing below.\n\n" + doc + "\n\nList the risks.")
    assert donor.worker_id is not None
    resident = wait_until(lambda: stock.resident_donor(donor.worker_id, _blocks(donor)), what="donor resident")
    reframed, _ = stock.send("Translate the following memo for the board, keeping its figures.\n\n" + doc + "\n\nGo.")
    assert reframed.exact_overlap_blocks == 0
    assert reframed.outcome == Outcome.SEMANTIC_PLACEMENT, reframed.decline_reason
    assert reframed.hint is not None and reframed.hint.donor_id == resident["donor_id"]
    assert reframed.hint.worker_id == donor.worker_id == reframed.worker_id
    assert reframed.hint.spans and sum(span[2] for span in reframed.hint.spans) >= 200


def test_router_agrees_with_dynamo_kv_routing_where_the_semantic_stage_does_not_apply(stock: Stock) -> None:
    """Same graph, same moment: Dynamo's choice (queried) vs the worker the router's request went to."""
    docs = [document(100 + i, 120) for i in range(4)]
    sequence = []
    for i, doc in enumerate(docs):
        sequence += [f"Question {i}: what changed?\n\n{doc}", f"Question {i}: what changed?\n\n{doc}"]
    for i, doc in enumerate(docs):
        sequence += [f"Question {i}: what changed?\n\n{doc} Also, who decided?"]
    compared = determined = agreed_determined = agreed = 0
    for prompt in sequence:
        expected = stock.dynamo_choice(prompt)
        evidence, _ = stock.send(prompt)
        if evidence.hint is not None:
            continue  # the semantic stage placed it: not Dynamo's decision by design
        compared += 1
        agreed += evidence.worker_id == expected
        if evidence.exact_overlap_blocks:  # no tie: Dynamo's choice is determined by the overlap
            determined += 1
            agreed_determined += evidence.worker_id == expected
        time.sleep(0.05)
    report = f"agreement {agreed}/{compared} overall, {agreed_determined}/{determined} with overlap"
    print(f"[{stock.graph.event_plane}] {report} (cold requests are ties Dynamo breaks at random)")
    assert determined >= 8 and agreed_determined == determined, report


def test_evicted_donor_gets_no_hint(stock: Stock) -> None:
    doc = document(3, 300)
    donor, _ = stock.send("Background for the meeting.\n\n" + doc)
    assert donor.worker_id is not None
    entry = wait_until(lambda: stock.resident_donor(donor.worker_id, _blocks(donor)), what="donor resident")

    def evicted() -> bool:
        return not any(d["donor_id"] == entry["donor_id"] and d["resident"] for d in stock.donors())

    seed = 1000
    while not evicted():  # long cold documents fill the small mocker caches; the mocker evicts and says so
        assert seed < 1040, "the donor's blocks were never evicted"
        stock.send(f"Archive item {seed}.\n\n" + document(seed, 1100))
        seed += 1
        time.sleep(0.1)
    reframed, _ = stock.send("Minutes, rewritten for the record.\n\n" + doc)
    assert reframed.hint is None or reframed.hint.donor_id != entry["donor_id"]
    assert reframed.outcome != Outcome.SEMANTIC_PLACEMENT or reframed.hint is not None


def test_worker_stopped_with_sigterm_leaves_the_index(stock: Stock) -> None:
    holders = {d["worker_id"] for d in stock.donors()}
    mocker = next(m for m in stock.graph.mockers if m.worker_id in holders)
    mocker.process.stop()
    assert mocker.process.proc.returncode is not None and mocker.process.proc.returncode >= 0  # not SIGKILLed
    wait_until(
        lambda: all(d["worker_id"] != mocker.worker_id for d in stock.donors()), what="stopped worker's donors gone"
    )
    after, _ = stock.send("After the restart.\n\n" + document(4, 200))
    assert after.worker_id is not None and after.worker_id != mocker.worker_id
