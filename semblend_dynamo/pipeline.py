"""Donor discovery: exact check -> token-exact spans -> (bounded) embedding search -> plan.

:class:`DonorDiscovery` owns the per-process view of resident donors: the :class:`SpanAligner` (token-exact
evidence) and the :class:`DonorIndex` (embedding evidence), both partitioned by the namespace digest.

Routing-path rules (docs/pipeline.md):

* exact prefix reuse wins first: when the exact overlap covers ``exact_route_threshold`` of the prompt,
  discovery stops with ``exact_prefix_wins``;
* token-exact spans are the fast path and never wait for an embedding; an accepted exact-equivalent plan skips
  the embedding entirely;
* the embedding only adds candidates and similarity, from at most ``max_embed_windows`` windows of the prompt;
* donors are embedded at registration, off the request path (a background thread by default);
* nothing here raises on user input: bad prompts and failed embeddings are counted declines.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import operator
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from .config import SemblendConfig
from .donor_index import DonorIndex, DonorIndexError
from .embedder import Embedder, EmbeddingError, embed_token_windows
from .index_snapshot import SnapshotError
from .namespace import NamespaceKey
from .outcomes import DeclineReason
from .planner import PlanDecision, Planner
from .policy import DonorPolicy, Tenancy
from .segmenter import Window, WindowSegmenter
from .span_aligner import Span, SpanAligner
from .tokenizer import TokenizerAdapter, TokenizerError

__all__ = ["CandidateDonor", "DiscoveryResult", "DonorDiscovery", "StageTimings"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CandidateDonor:
    """A donor with evidence for one target: token-exact coverage and/or embedding similarity.

    A slotted dataclass, as :class:`DiscoveryResult` (below): built from values discovery computed itself, where a
    pydantic model's validation cost more than the work.
    """

    donor_id: str
    similarity: float | None = None
    """Cosine similarity, None when not searched or not a hit."""
    span_tokens: int = 0
    """Target tokens covered by this donor's spans."""


@dataclass(slots=True)
class StageTimings:
    """Microseconds spent per stage of one :meth:`DonorDiscovery.discover` call (0 when skipped)."""

    exact_check: float = 0.0
    embed: float = 0.0
    search: float = 0.0
    align: float = 0.0
    plan: float = 0.0

    @property
    def total(self) -> float:
        return self.exact_check + self.embed + self.search + self.align + self.plan


@dataclass(slots=True)
class DiscoveryResult:
    """Everything discovery found for one request; ``decision`` is the planner's (or the exact check's) verdict."""

    request_id: str
    namespace: str
    """The namespace digest."""
    prompt_tokens: int
    exact_prefix_tokens: int
    exact_wins: bool
    covered: dict[str, int]
    """Target tokens covered by each donor's spans."""
    hits: dict[str, float]
    """Each embedding hit's similarity (empty when not searched)."""
    spans: list[Span]
    decision: PlanDecision
    primary_donor: str | None
    best_similarity: float | None
    embedded: bool
    """Whether the prompt was embedded and searched."""
    timings_us: StageTimings

    @property
    def candidates(self) -> list[CandidateDonor]:
        """Every donor with evidence, best first: most covered tokens, then highest similarity, then id.

        Ranked when read (the router reads a result's primary donor, spans and hits, not this list)."""
        return [CandidateDonor(i, self.hits.get(i), -tokens) for tokens, _, i in _ranked(self.covered, self.hits)]

    @property
    def has_evidence(self) -> bool:
        """Spans, or a candidate at or above the similarity threshold (set by discover)."""
        return bool(self.spans) or self.primary_donor is not None


class DonorDiscovery:
    """The in-process discovery pipeline. Thread-safe; one instance per router replica / connector.

    ``embedder`` may be None (spans only). ``tokenizer`` turns token windows into text for the embedder; without
    it, donors registered with ``text`` are embedded from that text and prompts are not embedded.
    ``background=False`` embeds donors inline (deterministic tests and replay); otherwise call :meth:`drain`
    to wait for pending donor embeddings.
    """

    def __init__(
        self,
        cfg: SemblendConfig,
        *,
        embedder: Embedder | None,
        index: DonorIndex | None,
        aligner: SpanAligner,
        tokenizer: TokenizerAdapter | None = None,
        background: bool = True,
    ) -> None:
        self.cfg = cfg
        self.policy = DonorPolicy(cfg)
        self.embedder = embedder if index is not None else None
        self.index = index
        self.aligner = aligner
        self.tokenizer = tokenizer
        self.planner = Planner(cfg)
        self.segmenter = WindowSegmenter(cfg.window_tokens, cfg.window_overlap)
        self.counters: Counter[str] = Counter()
        self._lock = threading.RLock()  # the aligner and _donors: held only briefly, discover() reads under it
        self._writer = threading.RLock()  # serializes donor mutations, index writes included (never under _lock)
        # donor id -> generation (from 1) of the donors registered with their tokens, oldest first: a plain dict (an
        # OrderedDict's links cost ~45 B a donor), a donor added again popped and set again. Donors known by their
        # embedding only (peers', a loaded snapshot's) are the index's alone, counted in _peers: an entry here each
        # cost 31 MB at 1M donors.
        self._donors: dict[str, int] = {}
        self._peers = 0
        self._generation = 0
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="semblend-embed") if background else None
        self._pending: set[Future[None]] = set()
        # The last namespace key searched and its digest, replaced as one tuple (read on any thread): a router's
        # requests of one tenant bring the same key object, found here by identity instead of hashing the key's model.
        self._last_digest: tuple[NamespaceKey | None, str] = (None, "")

    # --- donors -----------------------------------------------------------------------------------

    @classmethod
    def from_config(
        cls,
        cfg: SemblendConfig,
        *,
        embedder: Embedder,
        tokenizer: TokenizerAdapter | None = None,
        background: bool = True,
    ) -> DonorDiscovery:
        """The pipeline with the configured donor index (sized for ``embedder``) and span aligner."""
        return cls(
            cfg,
            embedder=embedder,
            index=DonorIndex.from_config(cfg, embedder.dim),
            aligner=SpanAligner(cfg.block_size, cfg.min_span_tokens),
            tokenizer=tokenizer,
            background=background,
        )

    def register_donor(
        self,
        donor_id: str,
        namespace: NamespaceKey,
        tokens: Sequence[int],
        text: str | None = None,
        *,
        embedding: np.ndarray | None = None,
        before_commit: Callable[[], None] | None = None,
    ) -> list[str]:
        """Make a finished request a donor: span-indexed now, embedded off the request path.

        Called when a request's KV becomes resident. A known id is replaced. Invalid tokens are counted
        (``invalid_donor``) and the donor is skipped; beyond ``index_capacity`` donors registered with their tokens the
        oldest of them is evicted (the index bounds every donor it holds the same way).
        ``embedding``: the vector :meth:`embed_prompt` already gave for this prompt (indexed as is, not recomputed).
        Returns the donors evicted to make room (those known now; a background embedding's are counted only).

        The tokens are hashed before any lock is taken and the aligner's tables updated under the lock discover()
        reads with, so a request never waits for a whole donor's indexing. ``before_commit`` is called between the
        two, holding no lock (the router's indexer waits there for requests being decided).
        """
        digest = namespace.digest()
        try:
            prepared = self.aligner.prepare_donor(donor_id, digest, tokens)
        except (ValueError, TypeError, OverflowError) as exc:
            self.counters["invalid_donor"] += 1
            log.debug("donor %s rejected: %s", donor_id, exc)
            return []
        if before_commit is not None:
            before_commit()
        with self._writer:
            with self._lock:
                self.aligner.commit_donor(prepared)
                self._generation += 1
                generation = self._generation
                if self._donors.pop(donor_id, None) is None and self.index is not None and donor_id in self.index:
                    self._peers -= 1  # a peer's donor, now registered here
                self._donors[donor_id] = generation
                self.counters["donors_registered"] += 1
                excess = len(self._donors) - self.cfg.index_capacity
                evicted = list(itertools.islice(self._donors, max(0, excess)))  # one pass over any holes ahead
                for oldest in evicted:
                    del self._donors[oldest]
                    self.aligner.remove_donor(oldest)
                    self.counters["donors_evicted"] += 1
            if self.index is not None:
                for gone in (donor_id, *evicted):
                    self.index.delete(gone)
            if self.embedder is None:
                return evicted
            if embedding is not None:
                return evicted + self._index_donor(donor_id, generation, digest, embedding)
        token_list = list(tokens)
        if self._executor is None:
            self._embed_donor(donor_id, generation, digest, token_list, text)
        else:
            future = self._executor.submit(self._embed_donor, donor_id, generation, digest, token_list, text)
            with self._lock:
                self._pending.add(future)
            future.add_done_callback(self._pending_done)
        return evicted

    def register_embeddings(self, donor_ids: Sequence[str], namespace_digest: str, vectors: np.ndarray) -> list[str]:
        """Index distinct donors of one namespace known only by their embeddings (peers' registrations: no tokens, so
        no spans), in one batched insert. A known id is replaced. Returns the donor ids the index pushed out by its
        capacity bound; a vector the index cannot take (wrong shape, NaN, zero norm) leaves its donor out, counted.
        """
        if self.index is None or not donor_ids:
            return []
        rows = np.asarray(vectors, dtype=np.float32)
        ids = list(donor_ids)
        if rows.ndim == 2 and len(rows) == len(ids):  # leave out what the index would refuse, not the whole batch
            with np.errstate(invalid="ignore", over="ignore"):
                usable = np.isfinite(rows).all(axis=1) & (np.linalg.norm(rows, axis=1) > 1e-12)
            self.counters["donor_embedding_errors"] += int((~usable).sum())
            ids, rows = [d for d, ok in zip(ids, usable.tolist(), strict=True) if ok], rows[usable]
        with self._writer:
            index = self.index
            with self._lock:
                peers = 0  # of donor_ids, those the index alone knew
                for donor_id in dict.fromkeys(donor_ids):
                    if self._donors.pop(donor_id, None) is not None:
                        self.aligner.remove_donor(donor_id)
                    elif donor_id in index:
                        peers += 1
            for donor_id in set(donor_ids) - set(ids):
                index.delete(donor_id)
            try:
                evicted = index.insert_batch(ids, namespace_digest, rows)  # replaces the ids it inserts
            except DonorIndexError as exc:
                for donor_id in ids:
                    index.delete(donor_id)
                with self._lock:
                    self._peers -= peers
                self.counters["donor_embedding_errors"] += len(ids)
                log.debug("%d donors not indexed: %s", len(ids), exc)
                return []
            with self._lock:
                self._peers += len(ids) - peers
            self._drop_evicted(evicted)
            return evicted

    def load_snapshot(self, path: str, same: Mapping[str, str] | None = None) -> list[str]:
        """Take a peer's saved search index (:meth:`DonorIndex.save_snapshot`) as this empty pipeline's donors (known
        by their embeddings only, as peers' donors are); their ids (``same``: as :meth:`DonorIndex.load_snapshot`).
        Raises SnapshotError, nothing changed, when the pipeline has donors or the file is not one its index takes."""
        if self.index is None:
            raise SnapshotError("incompatible", "no search index")
        with self._writer:
            with self._lock:
                if self._donors or self._peers:
                    raise SnapshotError("not_empty", f"the pipeline holds {len(self._donors) + self._peers} donors")
            ids = self.index.load_snapshot(path, same)
            with self._lock:
                self._peers = len(ids)
                self.counters["donors_loaded"] += len(ids)
            return ids

    def remove_donor(self, donor_id: str) -> bool:
        """Forget a donor (evicted or released on its worker). False if unknown."""
        with self._writer:
            with self._lock:
                local = self._donors.pop(donor_id, None) is not None
                if local:
                    self.aligner.remove_donor(donor_id)
            if self.index is not None and self.index.delete(donor_id) and not local:
                with self._lock:
                    self._peers -= 1
                return True
            return local

    def __contains__(self, donor_id: object) -> bool:
        with self._lock:
            return donor_id in self._donors or (self.index is not None and donor_id in self.index)

    def __len__(self) -> int:
        with self._lock:
            return len(self._donors) + self._peers

    def drain(self, timeout: float | None = None) -> None:
        """Wait until every donor embedding submitted so far is in the index."""
        with self._lock:
            pending = list(self._pending)
        for future in pending:
            future.result(timeout=timeout)

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)

    def _pending_done(self, future: Future[None]) -> None:
        with self._lock:
            self._pending.discard(future)

    def _embed_donor(self, donor_id: str, generation: int, digest: str, tokens: list[int], text: str | None) -> None:
        try:
            vector = self._embed(tokens, text)
        except (EmbeddingError, TokenizerError) as exc:
            self.counters["donor_embedding_errors"] += 1
            log.debug("donor %s not embedded: %s", donor_id, exc)
            return
        if vector is not None:
            with self._writer:
                self._index_donor(donor_id, generation, digest, vector)

    def _index_donor(self, donor_id: str, generation: int, digest: str, vector: np.ndarray) -> list[str]:
        """Insert a donor's vector (``_writer`` held, ``_lock`` not: discover() goes on meanwhile); the evicted."""
        assert self.index is not None
        with self._lock:
            if self._donors.get(donor_id) != generation:
                return []  # replaced or removed while it was being embedded
        try:
            evicted = self.index.insert(donor_id, digest, vector)
        except DonorIndexError as exc:
            self.counters["donor_embedding_errors"] += 1
            log.debug("donor %s not indexed: %s", donor_id, exc)
            return []
        return self._drop_evicted(evicted)

    def _drop_evicted(self, evicted: list[str]) -> list[str]:
        """The donors the index pushed out (each known: the index held it) leave the aligner too; returns them."""
        gone = list(dict.fromkeys(evicted))
        with self._lock:
            for donor_id in gone:
                if self._donors.pop(donor_id, None) is not None:
                    self.aligner.remove_donor(donor_id)
                else:
                    self._peers -= 1
                self.counters["donors_evicted"] += 1
        return gone

    def embed_prompt(self, tokens: Sequence[int], text: str | None = None) -> np.ndarray | None:
        """The unit vector this pipeline indexes for a prompt (e.g. to publish with a donor registration).

        Blocking (embeds up to ``max_embed_windows`` windows); None without an embedder or anything to embed.
        Raises EmbeddingError / TokenizerError for prompts that cannot be embedded.
        """
        return None if self.embedder is None else self._embed(tokens, text)

    def _embed(self, tokens: Sequence[int], text: str | None) -> np.ndarray | None:
        """One unit vector for a prompt: the normalized mean of a bounded sample of its windows."""
        assert self.embedder is not None
        if self.tokenizer is not None and len(tokens) > 0:
            vectors = embed_token_windows(self.embedder, self.tokenizer, tokens, self._windows(len(tokens)))
        elif text:
            vectors = self.embedder.embed([text])
        else:
            return None
        return _mean_unit(vectors)

    def _windows(self, n: int) -> list[Window]:
        return list(self.segmenter.sample(self.segmenter.windows(n), self.cfg.max_embed_windows))

    def embed_prompts(self, prompts: Sequence[Sequence[int]]) -> list[np.ndarray | None]:
        """:meth:`embed_prompt` for several prompts with one embedder call (blocking; run it off the event loop).

        A prompt that cannot be embedded gets None (counted ``prompt_embedding_errors``); one bad prompt does not
        fail the others.
        """
        if self.embedder is None or self.tokenizer is None:
            return [None] * len(prompts)
        texts: list[str] = []
        bounds: list[tuple[int, int] | None] = []
        for tokens in prompts:
            try:
                windows = self._windows(len(tokens)) if len(tokens) else []
                window_texts = [self.tokenizer.decode(tokens[w.start : w.end]) for w in windows]
            except (TokenizerError, ValueError, TypeError) as exc:
                log.debug("prompt not embedded: %s", exc)
                window_texts = []
            bounds.append((len(texts), len(texts) + len(window_texts)) if window_texts else None)
            texts += window_texts
        try:
            vectors = self.embedder.embed(texts) if texts else np.zeros((0, self.embedder.dim), np.float32)
        except EmbeddingError:  # one prompt's window broke the batch: embed each alone
            return [self._embed_or_none(tokens) for tokens in prompts]
        out: list[np.ndarray | None] = []
        for span in bounds:
            vector = None
            if span is not None:
                with contextlib.suppress(EmbeddingError):
                    vector = _mean_unit(vectors[span[0] : span[1]])
            if vector is None:
                self.counters["prompt_embedding_errors"] += 1
            out.append(vector)
        return out

    def _embed_or_none(self, tokens: Sequence[int]) -> np.ndarray | None:
        try:
            return self._embed(tokens, None)
        except (EmbeddingError, TokenizerError) as exc:
            self.counters["prompt_embedding_errors"] += 1
            log.debug("prompt not embedded: %s", exc)
            return None

    # --- requests ---------------------------------------------------------------------------------
    def discover(
        self,
        request_id: str,
        namespace: NamespaceKey,
        tokens: Sequence[int] | np.ndarray,
        *,
        exact_prefix_tokens: int = 0,
        device_prefix_tokens: int = 0,
        resident: Collection[str] | None = None,
        embed: bool = True,
        prompt_vector: np.ndarray | None = None,
        known_spans: Sequence[Span] | None = None,
        tenancy: Tenancy | None = None,
        timed: bool = True,
    ) -> DiscoveryResult:
        """Find donors for one request; never raises on the request's content.

        ``tokens``: an int64 array is searched as is (the router converts a request's ids once), anything else is
        converted.

        ``tenancy``: what the request's salt establishes (None: the caller built ``namespace`` from a known tenant);
        :meth:`DonorPolicy.may_seek` decides first whether the request may use semantic KV at all.

        ``exact_prefix_tokens``: the exact-prefix overlap the exact router found (it wins at or above
        ``exact_route_threshold`` of the prompt). ``device_prefix_tokens``: prompt tokens the chosen worker
        already holds (the plan extends them). ``resident``: restrict to these donor ids (None: all of the
        namespace). ``embed=False`` keeps to token-exact evidence. ``prompt_vector``: the prompt's embedding,
        computed beforehand (:meth:`embed_prompts`), searched instead of embedding here. ``known_spans``: the
        spans an earlier call for the same request found (not aligned again). ``timed=False``: no stage is timed (the
        result's ``timings_us`` stay 0; the router reads none of them and its request path is spared the clocks).
        """
        timings = StageTimings()
        digest = self._digest(namespace)
        t0 = time.perf_counter() if timed else 0.0
        try:
            target = _target(tokens)
        except (ValueError, TypeError, OverflowError) as exc:
            return self._finish(
                request_id,
                digest,
                0,
                exact_prefix_tokens,
                timings,
                reason=DeclineReason.INTERNAL_ERROR,
                detail=str(exc),
            )
        n = int(target.size)
        exact_wins = n > 0 and exact_prefix_tokens / n >= self.cfg.exact_route_threshold
        if timed:
            timings.exact_check = _us(t0)
        if n == 0:
            return self._finish(
                request_id,
                digest,
                0,
                exact_prefix_tokens,
                timings,
                reason=DeclineReason.EMPTY_PROMPT,
                detail="no tokens",
            )
        if exact_wins:
            detail = f"exact prefix {exact_prefix_tokens}/{n} >= {self.cfg.exact_route_threshold}"
            return self._finish(
                request_id,
                digest,
                n,
                exact_prefix_tokens,
                timings,
                reason=DeclineReason.EXACT_PREFIX_WINS,
                detail=detail,
            )
        refused = self.policy.may_seek(tenancy if tenancy is not None else Tenancy.from_salt(namespace.cache_salt))
        if refused is not None:
            return self._finish(request_id, digest, n, exact_prefix_tokens, timings, reason=refused, detail="")

        t0 = time.perf_counter() if timed else 0.0
        spans = list(known_spans) if known_spans is not None else self._align(digest, target, resident)
        if timed:
            timings.align = _us(t0)
            t0 = time.perf_counter()
        decision = self.planner.plan(n, spans, device_prefix_tokens=device_prefix_tokens)
        if timed:
            timings.plan = _us(t0)

        hits: dict[str, float] = {}
        embedded = False
        exact_plan = decision.plan is not None and decision.plan.mode == "exact"
        if embed and self.embedder is not None and n > self.cfg.block_size and not exact_plan:
            embedded, hits, kth, failure = self._search(
                digest, target, resident, timings if timed else None, prompt_vector
            )
            if failure is not None and not spans:  # no evidence at all: say why, rather than "no candidate"
                decision = PlanDecision(plan=None, reason=DeclineReason.INVALID_EMBEDDING, detail=failure)
            similarity = _span_similarity(spans, hits, kth, self.cfg.min_similarity)
            if spans and similarity is not None:
                t0 = time.perf_counter() if timed else 0.0
                decision = self.planner.plan(n, spans, similarity=similarity, device_prefix_tokens=device_prefix_tokens)
                if timed:
                    timings.plan += _us(t0)
        return self._result(request_id, digest, n, exact_prefix_tokens, spans, hits, embedded, decision, timings)

    def find_spans(
        self, namespace: NamespaceKey, tokens: Sequence[int] | np.ndarray, *, resident: Collection[str] | None = None
    ) -> list[Span] | None:
        """The token-exact spans :meth:`discover` would find for this prompt now, to hand it as ``known_spans``.

        For a caller with time to spare before it knows the exact overlap (the router, while Dynamo's exact query is
        in flight): the spans do not depend on it. None when ``tokens`` is not a prompt discover searches (discover
        then says why, and counts it). Counts nothing; the policy is discover's to apply.
        """
        try:
            target = _target(tokens)
        except (ValueError, TypeError, OverflowError):
            return None
        if not target.size:
            return None
        return self._align(self._digest(namespace), target, resident)

    def _digest(self, namespace: NamespaceKey) -> str:
        """The key's digest: the last one asked when the key is the same object (see ``_last_digest``)."""
        last = self._last_digest
        if last[0] is namespace:
            return last[1]
        digest = namespace.digest()
        self._last_digest = (namespace, digest)
        return digest

    def _align(self, digest: str, target: np.ndarray, resident: Collection[str] | None) -> list[Span]:
        with self._lock:
            return self.aligner.align(digest, target, candidates=resident, max_spans=min(2 * self.cfg.max_spans, 64))

    def _search(
        self,
        digest: str,
        target: np.ndarray,
        resident: Collection[str] | None,
        timings: StageTimings | None,
        prompt_vector: np.ndarray | None = None,
    ) -> tuple[bool, dict[str, float], float | None, str | None]:
        """Embed a bounded sample of the prompt's windows and search the namespace; counted on failure.

        Returns (searched, similarity per hit, the k-th similarity when the search returned a full top-k, why the
        prompt could not be embedded or searched if it could not). ``timings``: where the embedding's and the search's
        time go (None: not timed).
        """
        assert self.index is not None
        t0 = time.perf_counter()
        try:
            vector = prompt_vector if prompt_vector is not None else self._embed(target.tolist(), None)
        except (EmbeddingError, TokenizerError) as exc:
            self.counters["prompt_embedding_errors"] += 1
            log.debug("prompt not embedded: %s", exc)
            return False, {}, None, f"prompt not embedded: {exc}"
        finally:
            if timings is not None:
                timings.embed = _us(t0)
        if vector is None:
            return False, {}, None, None
        t0 = time.perf_counter()
        try:
            found = self.index.search(digest, vector, self.cfg.top_k)
        except DonorIndexError as exc:
            self.counters["prompt_embedding_errors"] += 1
            log.debug("search rejected the prompt vector: %s", exc)
            return False, {}, None, f"search rejected the prompt vector: {exc}"
        finally:
            if timings is not None:
                timings.search = _us(t0)
        allowed = None if resident is None else set(resident)
        hits = {h.donor_id: float(h.similarity) for h in found if allowed is None or h.donor_id in allowed}
        kth = found[-1].similarity if len(found) >= self.cfg.top_k else None
        return True, hits, kth, None

    def _result(
        self,
        request_id: str,
        digest: str,
        n: int,
        exact_prefix_tokens: int,
        spans: list[Span],
        hits: dict[str, float],
        embedded: bool,
        decision: PlanDecision,
        timings: StageTimings,
    ) -> DiscoveryResult:
        # Plain dicts and tuple keys: this runs on the router's request path once per request (a Counter's missing
        # keys and a key function reading each model's fields cost more than the work). The candidates are not built
        # (DiscoveryResult.candidates ranks them when read): the primary donor is found without them.
        covered: dict[str, int] = {}
        for s in spans:
            covered[s.donor_id] = covered.get(s.donor_id, 0) + s.length
        if decision.plan is not None:
            used: dict[str, int] = {}
            for s in decision.plan.spans:
                used[s.donor_id] = used.get(s.donor_id, 0) + s.length
            primary: str | None = max(used, key=used.__getitem__)  # the first of the most used, as Counter.most_common
        elif covered and hits:  # the first candidate: every other one covers fewer tokens (a hit alone covers none)
            primary = min(_rank(i, covered, hits) for i in covered)[2]
        elif covered:  # the same without hits (the router's span path): most covered tokens, then id, compared in C
            primary = min(zip(map(operator.neg, covered.values()), covered, strict=True))[1]
        else:
            above = [i for _, similarity, i in _ranked(covered, hits) if -similarity >= self.cfg.min_similarity]
            primary = above[0] if above else None
        if decision.reason is not None:
            self.counters[_DECLINE_COUNTER[decision.reason]] += 1
        return DiscoveryResult(
            request_id=request_id,
            namespace=digest,
            prompt_tokens=n,
            exact_prefix_tokens=exact_prefix_tokens,
            exact_wins=False,
            covered=covered,
            hits=hits,
            spans=spans,
            decision=decision,
            primary_donor=primary,
            best_similarity=max(hits.values()) if hits else None,
            embedded=embedded,
            timings_us=timings,
        )

    def _finish(
        self,
        request_id: str,
        digest: str,
        n: int,
        exact_prefix_tokens: int,
        timings: StageTimings,
        *,
        reason: DeclineReason,
        detail: str,
    ) -> DiscoveryResult:
        """A result decided before any discovery ran (exact win, bad or empty prompt, disabled)."""
        self.counters[_DECLINE_COUNTER[reason]] += 1
        return DiscoveryResult(
            request_id=request_id,
            namespace=digest,
            prompt_tokens=n,
            exact_prefix_tokens=exact_prefix_tokens,
            exact_wins=reason is DeclineReason.EXACT_PREFIX_WINS,
            covered={},
            hits={},
            spans=[],
            decision=PlanDecision(plan=None, reason=reason, detail=detail),
            primary_donor=None,
            best_similarity=None,
            embedded=False,
            timings_us=timings,
        )


_DECLINE_COUNTER = {reason: f"decline:{reason.value}" for reason in DeclineReason}
"""Each decline's key in :attr:`DonorDiscovery.counters`."""


def _rank(donor_id: str, covered: dict[str, int], hits: dict[str, float]) -> tuple[int, float, str]:
    """A candidate's place: most covered tokens first, then highest similarity, then donor id."""
    return -covered.get(donor_id, 0), -(hits.get(donor_id) or 0.0), donor_id


def _ranked(covered: dict[str, int], hits: dict[str, float]) -> list[tuple[int, float, str]]:
    """:func:`_rank` of every donor with evidence, sorted: the candidates' order."""
    return sorted(_rank(i, covered, hits) for i in {**covered, **hits})


_INT64 = np.dtype(np.int64)


def _target(tokens: Sequence[int] | np.ndarray) -> np.ndarray:
    """A prompt's tokens as the flat int64 array the aligner searches (an int64 array is taken as is)."""
    target = np.ascontiguousarray(tokens, dtype=_INT64)
    if target.ndim != 1:
        raise ValueError("tokens must be a flat sequence")
    return target


def _span_similarity(spans: list[Span], hits: dict[str, float], kth: float | None, threshold: float) -> float | None:
    """Similarity evidence for the span donors: the best hit among them; else, when a full top-k left them all
    out, the k-th similarity (an upper bound for theirs) if it is already below ``threshold``; else None."""
    sims = [hits[s.donor_id] for s in spans if s.donor_id in hits]
    if sims:
        return max(sims)
    if kth is not None and kth < threshold:
        return kth
    return None


def _mean_unit(vectors: np.ndarray) -> np.ndarray:
    mean = vectors.mean(axis=0) if len(vectors) else np.zeros(0, np.float32)
    norm = float(np.linalg.norm(mean))
    if not np.isfinite(norm) or norm <= 1e-12:
        raise EmbeddingError("mean embedding is not a finite non-zero vector")
    return (mean / norm).astype(np.float32)


def _us(t0: float) -> float:
    return (time.perf_counter() - t0) * 1e6
