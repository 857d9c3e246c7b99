from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from semblend_apps.replay.workload import load_corpus
from semblend_dynamo.config import SemblendConfig
from semblend_dynamo.donor_index import DonorIndex
from semblend_dynamo.embedder import EmbeddingError, HashEmbedder
from semblend_dynamo.namespace import NamespaceKey
from semblend_dynamo.outcomes import DeclineReason
from semblend_dynamo.pipeline import DonorDiscovery
from semblend_dynamo.span_aligner import SpanAligner
from semblend_dynamo.tokenizer import TokenizerAdapter

BS = 32
NS = NamespaceKey(model_id="test-model", tokens_per_block=BS, cache_salt="tenant-a")
OTHER_NS = NS.with_salt("tenant-b")


@pytest.fixture(scope="module")
def tokenizer() -> TokenizerAdapter:
    return TokenizerAdapter.bundled()


@pytest.fixture(scope="module")
def docs(tokenizer: TokenizerAdapter) -> list[list[int]]:
    return [tokenizer.encode(d.text) for d in load_corpus()[:6]]


def make(tokenizer: TokenizerAdapter | None, embedder: Any = None, **overrides: Any) -> DonorDiscovery:
    values: dict[str, Any] = {"embedder": "hash", "block_size": BS, "min_span_tokens": 64, "max_embed_windows": 4}
    values.update(overrides)
    cfg = SemblendConfig(**values)
    emb = embedder if embedder is not None else HashEmbedder()
    return DonorDiscovery(
        cfg,
        embedder=emb,
        index=DonorIndex(emb.dim, cfg.index_capacity),
        aligner=SpanAligner(cfg.block_size, cfg.min_span_tokens),
        tokenizer=tokenizer,
        background=False,
    )


class FailingEmbedder:
    """Test double: every embedding call fails like a broken model would."""

    name = "failing"
    dim = 384

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        raise EmbeddingError("model unavailable")


class BlockingEmbedder(HashEmbedder):
    """Test double: a hash embedder that waits for a gate, to hold a donor embedding in flight."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.gate.wait(timeout=10)
        return super().embed(texts)


def test_exact_prefix_wins_first(tokenizer: TokenizerAdapter, docs: list[list[int]]) -> None:
    discovery = make(tokenizer)
    discovery.register_donor("d", NS, docs[0][:600])
    result = discovery.discover("r", NS, docs[0][:600], exact_prefix_tokens=320)
    assert result.exact_wins and result.decision.reason is DeclineReason.EXACT_PREFIX_WINS
    assert result.spans == [] and result.embedded is False


def test_span_fast_path_accepts_exact_equivalent_prefix_without_embedding(
    tokenizer: TokenizerAdapter, docs: list[list[int]]
) -> None:
    discovery = make(tokenizer)
    discovery.register_donor("d", NS, docs[0][:640])
    target = docs[0][:400] + docs[1][:300]
    result = discovery.discover("r", NS, target, exact_prefix_tokens=0)
    assert result.decision.accepted and result.decision.plan is not None
    assert result.decision.plan.spans[0].donor_id == "d" and result.decision.plan.reused_tokens == 384
    assert result.primary_donor == "d"
    assert result.embedded is False  # an exact-equivalent plan needs no embedding evidence
    assert result.timings_us.embed == 0.0


def test_shifted_reorder_uses_spans_and_similarity(tokenizer: TokenizerAdapter, docs: list[list[int]]) -> None:
    discovery = make(tokenizer, exact_materialization_only=False, isolation="cache_salt")
    chunks = [docs[i][:128] for i in range(4)]
    discovery.register_donor("d", NS, [t for c in chunks for t in c] + docs[5][:40])
    target = chunks[2] + chunks[0] + chunks[3] + chunks[1] + docs[4][:40]
    result = discovery.discover("r", NS, target)
    plan = result.decision.plan
    assert result.decision.accepted and plan is not None, result.decision.detail
    assert [(s.target_start, s.delta) for s in plan.spans] == [(0, -256), (128, 128), (256, -128), (384, 256)]
    assert plan.mode == "shifted" and plan.requires_rope_correction
    assert result.embedded and result.candidates[0].donor_id == "d"
    assert result.candidates[0].similarity is not None and result.candidates[0].similarity > 0.5


def test_cross_namespace_donors_are_never_candidates(tokenizer: TokenizerAdapter, docs: list[list[int]]) -> None:
    discovery = make(tokenizer)
    discovery.register_donor("tenant-a-donor", NS, docs[0][:600])
    result = discovery.discover("r", OTHER_NS, docs[0][:600])
    assert result.decision.reason is DeclineReason.NO_CANDIDATE
    assert result.candidates == [] and result.primary_donor is None
    assert result.embedded  # it searched, in its own (empty) namespace


def test_similarity_only_evidence_names_a_primary_donor(tokenizer: TokenizerAdapter, docs: list[list[int]]) -> None:
    discovery = make(tokenizer)
    discovery.register_donor("d", NS, docs[2][:600])
    edited = list(docs[2][:600])
    for p in range(5, 600, 24):  # no exact run of 64 tokens survives
        edited[p] = (edited[p] + 7) % tokenizer.vocab_size
    result = discovery.discover("r", NS, edited)
    assert result.spans == [] and result.decision.reason is DeclineReason.NO_CANDIDATE
    assert result.primary_donor == "d" and result.best_similarity is not None
    assert result.best_similarity >= discovery.cfg.min_similarity


def test_low_similarity_declines_shifted_spans(tokenizer: TokenizerAdapter, docs: list[list[int]]) -> None:
    discovery = make(
        tokenizer, exact_materialization_only=False, isolation="cache_salt", min_reuse_ratio=0.05, min_similarity=0.95
    )
    discovery.register_donor("d", NS, docs[5][:7] + docs[0][:256])
    result = discovery.discover("r", NS, docs[0][:160] + docs[3][:1200])
    assert result.spans and result.decision.reason is DeclineReason.BELOW_SIMILARITY, result.decision.detail


@pytest.mark.parametrize(
    ("tokens", "reason"),
    [
        ([], DeclineReason.EMPTY_PROMPT),
        ([1, 2, 3], DeclineReason.PROMPT_TOO_SHORT),
        (["not", "token", "ids"], DeclineReason.INTERNAL_ERROR),
        ([[1, 2], [3, 4]], DeclineReason.INTERNAL_ERROR),
    ],
)
def test_bad_prompts_are_counted_declines(tokenizer: TokenizerAdapter, tokens: Any, reason: DeclineReason) -> None:
    discovery = make(tokenizer)
    result = discovery.discover("r", NS, tokens)
    assert result.decision.reason is reason
    assert discovery.counters[f"decline:{reason.value}"] == 1


def test_out_of_vocabulary_prompt_is_searched_safely(tokenizer: TokenizerAdapter, docs: list[list[int]]) -> None:
    discovery = make(tokenizer)
    discovery.register_donor("d", NS, docs[0][:600])
    result = discovery.discover("r", NS, [10**9] * 200)  # ids the tokenizer cannot decode
    assert result.decision.reason is DeclineReason.INVALID_EMBEDDING and not result.embedded
    assert "not embedded" in result.decision.detail
    assert discovery.counters["prompt_embedding_errors"] == 1
    assert discovery.counters["decline:invalid_embedding"] == 1 and not discovery.counters["decline:no_candidate"]


def test_embedding_failure_keeps_the_donor_span_indexed(tokenizer: TokenizerAdapter, docs: list[list[int]]) -> None:
    discovery = make(tokenizer, embedder=FailingEmbedder())
    discovery.register_donor("d", NS, docs[0][:640])
    assert discovery.counters["donor_embedding_errors"] == 1 and "d" in discovery
    result = discovery.discover("r", NS, docs[0][:400] + docs[1][:300])
    assert result.decision.accepted and result.primary_donor == "d"


def test_precomputed_donor_embedding_is_indexed_without_embedding_again(
    tokenizer: TokenizerAdapter, docs: list[list[int]]
) -> None:
    """The router already embedded a finished prompt for its DonorRegistration: the pipeline must reuse it."""
    vector = make(tokenizer).embed_prompt(docs[0][:640])
    assert vector is not None
    discovery = make(tokenizer, embedder=FailingEmbedder())  # would count an error if it embedded anything
    discovery.register_donor("d", NS, docs[0][:640], embedding=vector)
    assert discovery.counters["donor_embedding_errors"] == 0
    assert discovery.index is not None
    hits = discovery.index.search(NS.digest(), vector, 1)
    assert hits[0].donor_id == "d" and hits[0].similarity == pytest.approx(1.0, abs=1e-3)


def test_invalid_donor_tokens_are_counted_not_raised(tokenizer: TokenizerAdapter) -> None:
    discovery = make(tokenizer)
    discovery.register_donor("bad", NS, [1, -2, 3] * 50)
    assert "bad" not in discovery and discovery.counters["invalid_donor"] == 1


def test_capacity_evicts_the_oldest_donor_everywhere(tokenizer: TokenizerAdapter, docs: list[list[int]]) -> None:
    discovery = make(tokenizer, index_capacity=2)
    for i in range(3):
        discovery.register_donor(f"d{i}", NS, docs[i][:300])
    assert "d0" not in discovery and "d0" not in discovery.aligner and discovery.index is not None
    assert "d0" not in discovery.index and len(discovery.index) == 2
    assert discovery.counters["donors_evicted"] == 1
    assert discovery.discover("r", NS, docs[0][:300] + docs[4][:100]).decision.reason is DeclineReason.NO_CANDIDATE


def test_resident_set_restricts_candidates(tokenizer: TokenizerAdapter, docs: list[list[int]]) -> None:
    discovery = make(tokenizer)
    discovery.register_donor("d", NS, docs[0][:640])
    result = discovery.discover("r", NS, docs[0][:400] + docs[1][:300], resident=[])
    assert result.spans == [] and result.candidates == []


def test_background_embedding_and_removal_while_in_flight(docs: list[list[int]], tokenizer: TokenizerAdapter) -> None:
    embedder = BlockingEmbedder()
    cfg = SemblendConfig(embedder="hash", block_size=BS, min_span_tokens=64)
    discovery = DonorDiscovery(
        cfg,
        embedder=embedder,
        index=DonorIndex(embedder.dim, cfg.index_capacity),
        aligner=SpanAligner(BS, 64),
        tokenizer=tokenizer,
    )
    try:
        discovery.register_donor("kept", NS, docs[0][:300])
        discovery.register_donor("removed", NS, docs[1][:300])
        assert "kept" in discovery.aligner  # span-indexed before its embedding finished
        assert discovery.remove_donor("removed")
        embedder.gate.set()
        discovery.drain(timeout=30)
        assert discovery.index is not None
        assert "kept" in discovery.index and "removed" not in discovery.index
    finally:
        discovery.close()


class NaNEmbedder:
    """Test double: an embedder that returns NaN vectors without checking them (a broken custom model)."""

    name = "nan"
    dim = 384

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return np.full((len(texts), self.dim), np.nan, dtype=np.float32)


def test_nan_embeddings_are_counted_and_spans_still_work(tokenizer: TokenizerAdapter, docs: list[list[int]]) -> None:
    discovery = make(tokenizer, embedder=NaNEmbedder(), exact_materialization_only=False, isolation="cache_salt")
    discovery.register_donor("d", NS, docs[0][:640])
    discovery.register_donor("d", NS, docs[1][:640])  # duplicate id: replaces the first registration
    assert len(discovery) == 1 and discovery.counters["donor_embedding_errors"] == 2
    result = discovery.discover("r", NS, docs[3][:50] + docs[1][:600])
    assert discovery.counters["prompt_embedding_errors"] == 1 and not result.embedded
    assert [s.donor_id for s in result.spans] == ["d"]
    assert result.decision.reason is not DeclineReason.INVALID_EMBEDDING  # the spans decide, as without embeddings


def test_embed_prompt_matches_what_the_index_holds(tokenizer: TokenizerAdapter, docs: list[list[int]]) -> None:
    discovery = make(tokenizer)
    discovery.register_donor("d", NS, docs[0][:600])
    vector = discovery.embed_prompt(docs[0][:600])
    assert vector is not None and discovery.index is not None
    hits = discovery.index.search(NS.digest(), vector, 1)
    assert hits[0].donor_id == "d" and hits[0].similarity == pytest.approx(1.0, abs=1e-5)
    assert make(tokenizer, embedder=FailingEmbedder()).embed_prompt([]) is None


def test_spans_found_ahead_decide_as_discover_would(tokenizer: TokenizerAdapter, docs: list[list[int]]) -> None:
    """The router searches spans while Dynamo's exact query is in flight, then decides with them: the same result."""
    discovery = make(tokenizer, exact_materialization_only=False, isolation="cache_salt")
    chunks = [docs[i][:128] for i in range(4)]
    discovery.register_donor("d", NS, [t for c in chunks for t in c] + docs[5][:40])
    target = chunks[2] + chunks[0] + chunks[3] + chunks[1] + docs[4][:40]
    spans = discovery.find_spans(NS, np.asarray(target, dtype=np.int64))
    assert spans is not None and len(spans) == 4
    for exact in (0, 320):  # the exact answer only gates: an exact win ignores the spans found ahead
        ahead = discovery.discover("r", NS, target, exact_prefix_tokens=exact, known_spans=spans)
        inline = discovery.discover("r", NS, target, exact_prefix_tokens=exact)
        assert dataclasses.replace(ahead, timings_us=inline.timings_us) == inline
    assert discovery.find_spans(OTHER_NS, target) == []
    assert discovery.find_spans(NS, target, resident=[]) == []


@pytest.mark.parametrize("tokens", [[], ["not", "token", "ids"], [[1, 2], [3, 4]]])
def test_finding_spans_ahead_of_an_unsearchable_prompt_gives_none(tokenizer: TokenizerAdapter, tokens: Any) -> None:
    discovery = make(tokenizer)
    assert discovery.find_spans(NS, tokens) is None
    assert not discovery.counters  # discover, called next, counts the decline once


def test_before_commit_runs_after_hashing_and_before_the_donor_is_searchable(
    tokenizer: TokenizerAdapter, docs: list[list[int]]
) -> None:
    """The indexer's pause point: the tokens are hashed, no lock is held and the spans do not find the donor yet."""
    discovery = make(tokenizer)
    seen: list[tuple[bool, list[Any] | None]] = []

    def before_commit() -> None:
        locked = not discovery._lock.acquire(blocking=False)
        if not locked:
            discovery._lock.release()
        seen.append((locked, discovery.find_spans(NS, docs[0][:600])))

    discovery.register_donor("d", NS, docs[0][:600], before_commit=before_commit)
    assert seen == [(False, [])]
    assert [s.donor_id for s in discovery.find_spans(NS, docs[0][:600]) or []] == ["d"]


def _reference_ranking(spans: Sequence[Any], plan_spans: Sequence[Any] | None, hits: dict[str, float]) -> Any:
    """The candidates' order and the primary donor as ``_result`` computed them with ``Counter`` (session 12's code)."""
    from collections import Counter

    covered: Counter[str] = Counter()
    for s in spans:
        covered[s.donor_id] += s.length
    ids = list(dict.fromkeys([*covered, *hits]))
    ranked = sorted(ids, key=lambda i: (-covered[i], -(hits.get(i) or 0.0), i))
    primary = None
    if plan_spans is not None:
        used: Counter[str] = Counter()
        for s in plan_spans:
            used[s.donor_id] += s.length
        primary = used.most_common(1)[0][0]
    elif covered:
        primary = ranked[0]
    return [(i, hits.get(i), covered[i]) for i in ranked], primary


def test_candidates_and_primary_donor_are_ranked_as_before() -> None:
    """``_result`` (plain dicts on the request path) ranks candidates and picks the primary donor exactly as the
    ``Counter`` code before it, ties included (equal coverage, equal similarity, a plan using two donors equally)."""
    from semblend_dynamo.pipeline import StageTimings
    from semblend_dynamo.planner import MaterializationPlan, PlanDecision
    from semblend_dynamo.span_aligner import Span

    discovery = make(None)
    rng = np.random.default_rng(5)
    for case in range(400):
        names = [f"d{k}" for k in range(int(rng.integers(1, 7)))]
        spans = [
            Span(str(rng.choice(names)), int(rng.integers(0, 512)), 64 * k, 64 * int(rng.integers(1, 3)))
            for k in range(int(rng.integers(0, 9)))
        ]
        hits = {str(n): float(rng.choice([0.0, 0.5, 0.9])) for n in names if rng.random() < 0.5}
        plan_spans = spans[: int(rng.integers(1, len(spans) + 1))] if spans and case % 2 else None
        plan = None if plan_spans is None else MaterializationPlan(plan_spans, 4096, 0, 0.0, False, 0.0, "shifted")
        decision = PlanDecision(plan, None)
        for evidence in (hits, {}):  # with embedding hits, and without (the router's span path)
            result = discovery._result("r", "ns", 4096, 0, spans, evidence, False, decision, StageTimings())
            want, primary = _reference_ranking(spans, plan_spans, evidence)
            assert [(c.donor_id, c.similarity, c.span_tokens) for c in result.candidates] == want
            if plan_spans is not None or spans:
                assert result.primary_donor == primary


def test_an_untimed_discover_is_the_timed_one_without_its_clocks(
    tokenizer: TokenizerAdapter, docs: list[list[int]]
) -> None:
    """``timed=False`` (the router reads no stage timing): the result of the timed call, every timing 0, counted the
    same; for plans, declines found by the planner and declines decided before it."""
    from collections import Counter

    from semblend_dynamo.pipeline import StageTimings
    from semblend_dynamo.policy import Tenancy

    discovery = make(tokenizer, exact_materialization_only=False, isolation="cache_salt")
    chunks = [docs[i][:128] for i in range(4)]
    discovery.register_donor("d", NS, [t for c in chunks for t in c] + docs[5][:40])
    discovery.register_donor("e", NS, docs[0][:640])
    shifted = chunks[2] + chunks[0] + chunks[3] + chunks[1] + docs[4][:40]
    spans = discovery.find_spans(NS, np.asarray(shifted, dtype=np.int64))
    cases: list[tuple[Any, dict[str, Any]]] = [
        (shifted, {}),
        (shifted, {"embed": False}),
        (np.asarray(shifted, dtype=np.int64), {"embed": False, "known_spans": spans}),
        (docs[0][:400] + docs[1][:300], {}),
        (docs[0][:600], {"exact_prefix_tokens": 320}),
        (docs[3][:600], {"embed": False}),
        (shifted, {"tenancy": Tenancy.unknown()}),
        ([], {}),
        ([1, 2, 3], {}),
        (["not", "token", "ids"], {}),
    ]
    for tokens, kwargs in cases:
        before = Counter(discovery.counters)
        timed = discovery.discover("r", NS, tokens, **kwargs)
        middle = Counter(discovery.counters)
        untimed = discovery.discover("r", NS, tokens, timed=False, **kwargs)
        assert untimed.timings_us == StageTimings()
        assert dataclasses.replace(untimed, timings_us=timed.timings_us) == timed
        assert Counter(discovery.counters) - middle == middle - before
    assert discovery.discover("r", NS, shifted).timings_us.plan > 0  # timed by default


def test_each_prompt_is_searched_in_its_own_namespace_whichever_key_came_before(
    tokenizer: TokenizerAdapter, docs: list[list[int]]
) -> None:
    """The same tokens, donors in two namespaces: discover and find_spans search the key's own, for keys in turns, the
    same key again, and an equal key that is another object."""
    discovery = make(tokenizer)
    discovery.register_donor("a", NS, docs[0][:640])
    discovery.register_donor("b", OTHER_NS, docs[0][:640])
    target = docs[0][:400] + docs[1][:300]
    equal = NamespaceKey(**NS.model_dump())
    assert equal == NS and equal is not NS
    for key, donor in [(NS, "a"), (OTHER_NS, "b"), (NS, "a"), (equal, "a"), (OTHER_NS, "b"), (OTHER_NS, "b")]:
        result = discovery.discover("r", key, target, embed=False)
        assert result.namespace == key.digest() and result.primary_donor == donor
        assert {s.donor_id for s in result.spans} == {donor}
        assert {s.donor_id for s in discovery.find_spans(key, target) or []} == {donor}


def _unit(n: int, dim: int, seed: int = 0) -> np.ndarray:
    rows = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def test_donors_known_by_their_embedding_only_are_the_indexs_alone(
    tokenizer: TokenizerAdapter, docs: list[list[int]]
) -> None:
    """Peers' donors (and a loaded snapshot's) keep no entry in the pipeline's own map of donors (a dict entry each,
    ~42 MB at 1M): the index answers whether they are known and counts them. A local registration of one makes it
    local; a peer's registration of a local one makes it a peer's again; removal, a refused vector and the index's
    capacity take them out of the count."""
    discovery = make(tokenizer)
    assert discovery.index is not None
    dim, digest = discovery.index.dim, NS.digest()
    assert discovery.register_embeddings(["p0", "p1", "p2"], digest, _unit(3, dim)) == []
    assert len(discovery) == 3 and all(d in discovery for d in ("p0", "p1", "p2")) and not discovery._donors
    discovery.register_donor("p1", NS, docs[0][:300])  # now local: spans and a generation
    assert len(discovery) == 3 and list(discovery._donors) == ["p1"] and "p1" in discovery.aligner
    discovery.register_embeddings(["p1"], digest, _unit(1, dim, seed=1))  # a peer's copy again
    assert len(discovery) == 3 and not discovery._donors and "p1" not in discovery.aligner
    assert discovery.remove_donor("p0") and not discovery.remove_donor("p0")
    assert len(discovery) == 2 and "p0" not in discovery
    nan = np.full((1, dim), np.nan, dtype=np.float32)
    discovery.register_embeddings(["p2"], digest, nan)  # refused: the donor leaves
    assert len(discovery) == 1 and "p2" not in discovery and discovery.counters["donor_embedding_errors"] == 1
    assert discovery.remove_donor("p1") and len(discovery) == 0

    small = make(tokenizer, index_capacity=2)
    assert small.register_embeddings(["a", "b"], digest, _unit(2, dim)) == []
    small.register_donor("c", NS, docs[1][:300])  # local, embedded at once (no background thread): evicts "a"
    assert "a" not in small and len(small) == 2 and small.counters["donors_evicted"] == 1
    assert small.register_embeddings(["d", "e", "f"], digest, _unit(3, dim, seed=2)) == ["d", "b", "c"]
    assert len(small) == 2 and {"e", "f"} == {d for d in "abcdef" if d in small} and not small._donors
