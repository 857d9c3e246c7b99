"""The bundled, deterministic replay workload: donors plus target requests built from the bundled corpus.

Everything is built at the token level with the bundled tokenizer and a seeded RNG, so the same seed gives the
same token ids on every machine. Each request records the *kind* of reuse it was built to exercise
(:class:`RequestKind`) and which donors it was derived from. Some boundaries are block-aligned on purpose (a
system prompt of whole blocks, fixed-size RAG chunks of whole blocks, as token-based chunkers produce); the
instruction framings are not, which is what makes instruction variants non-prefix reuse.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from enum import Enum
from functools import cache
from importlib import resources

from pydantic import BaseModel, ConfigDict, Field

from semblend_dynamo.policy import Tenancy
from semblend_dynamo.tokenizer import TokenizerAdapter

__all__ = [
    "CorpusDocument",
    "RequestKind",
    "Workload",
    "WorkloadDonor",
    "WorkloadRequest",
    "build_workload",
    "load_corpus",
]

TENANT = "tenant-a"
OTHER_TENANT = "tenant-b"
UNKNOWN_TENANT = "tenant-without-donors"

_SYSTEM_PROMPTS = (
    "You are a careful technical assistant for the Python standard library. Answer strictly from the reference "
    "material provided below, quote the relevant passage when useful, and say so plainly when the material does "
    "not contain the answer. Keep answers short and precise, and never invent functions or parameters.",
    "You are a documentation reviewer. Read the excerpts below, which come from the reference manual of a "
    "widely used programming library, and answer the user's question using only those excerpts. Cite the excerpt "
    "you rely on, point out ambiguities, and keep the answer under two hundred words.",
)
_INSTRUCTIONS = (
    "Summarize the following documentation for a new engineer joining the team.",
    "Read this reference text carefully; afterwards you will answer questions about it.",
    "Here is an excerpt from the manual.",
    "Please explain, in plain language and with one example, what the text below describes and when to use it.",
    "Translate the key ideas of the following passage into a short checklist.",
    "Below is some documentation. Identify the three most important points.",
)
_QUESTIONS = (
    "What does the documentation say about {w}?",
    "How is {w} used, and what are its limits?",
    "Which part of the text explains {w}? Quote it.",
    "Is {w} safe to use from several threads?",
    "Give an example that involves {w}.",
    "Why would someone need {w} at all?",
)


class RequestKind(str, Enum):
    """The reuse situation a request was built to exercise."""

    EXACT_REPEAT = "exact_repeat"
    SAME_DOC_NEW_QUESTION = "same_doc_new_question"
    INSTRUCTION_VARIANT = "instruction_variant"
    RAG_REORDER = "rag_reorder"
    MULTI_DONOR = "multi_donor"
    FUZZY_EDIT = "fuzzy_edit"
    NEGATIVE_CONTROL = "negative_control"
    BAD_INPUT = "bad_input"
    OTHER = "other"  # a manifest transform with no kind of its own


class CorpusDocument(BaseModel):
    model_config = ConfigDict(frozen=True)

    doc_id: str
    title: str
    text: str


class WorkloadDonor(BaseModel):
    """An earlier request whose KV is resident (registered with discovery before the targets run)."""

    donor_id: str
    tenant: str
    tokens: list[int]


class WorkloadRequest(BaseModel):
    """A target request. ``related_donors`` are the donors it was derived from (empty for negative controls).

    ``seed_donors`` are registered just before this request runs (a manifest item seeds its own donors); donors
    no request seeds are registered before any request. ``transform`` is the manifest's name for the request's
    situation (SemBench's ``transform``); the bundled workload leaves it empty and its kind names it.
    """

    request_id: str
    kind: RequestKind
    variant: str
    tenant: str
    tokens: list[int]
    related_donors: list[str] = Field(default_factory=list)
    seed_donors: list[str] = Field(default_factory=list)
    transform: str = ""
    tenant_known: bool = True
    """False models a request whose engine passed no salt field: its tenant cannot be established."""

    @property
    def transform_name(self) -> str:
        return self.transform or self.kind.value

    @property
    def tenancy(self) -> Tenancy:
        return Tenancy.from_salt(self.tenant) if self.tenant_known else Tenancy.unknown()


class Workload(BaseModel):
    seed: int
    block_size: int
    tokenizer_fingerprint: str
    donors: list[WorkloadDonor]
    requests: list[WorkloadRequest]

    def kinds(self) -> list[RequestKind]:
        """Kinds present, in enum order."""
        present = {r.kind for r in self.requests}
        return [k for k in RequestKind if k in present]


def load_corpus() -> list[CorpusDocument]:
    """The bundled corpus (``semblend_dynamo/data/corpus``), in INDEX.json order."""
    return list(_load_corpus())


@cache
def _load_corpus() -> tuple[CorpusDocument, ...]:
    root = resources.files("semblend_dynamo") / "data" / "corpus"
    index = json.loads((root / "INDEX.json").read_text(encoding="utf-8"))
    return tuple(
        CorpusDocument(doc_id=d["doc_id"], title=d["title"], text=(root / f"{d['doc_id']}.txt").read_text("utf-8"))
        for d in index["documents"]
    )


class _Builder:
    """Token-level composition helpers over one tokenizer and one RNG."""

    def __init__(self, tokenizer: TokenizerAdapter, block_size: int, seed: int) -> None:
        self.tok = tokenizer
        self.bs = block_size
        self.rng = random.Random(seed)
        docs = list(_load_corpus())
        self.rng.shuffle(docs)
        held = max(2, len(docs) // 4)
        self.held_out = docs[:held]  # never registered as donors: negative controls draw from these
        self.pool = docs[held:]
        self._tokens: dict[str, list[int]] = {}
        self._next_doc = 0
        self.system = [self.whole_blocks(self.tok.encode(s), 2) for s in _SYSTEM_PROMPTS]

    def doc_tokens(self, doc: CorpusDocument) -> list[int]:
        if doc.doc_id not in self._tokens:
            self._tokens[doc.doc_id] = self.tok.encode(doc.text)
        return self._tokens[doc.doc_id]

    def next_doc(self) -> CorpusDocument:
        doc = self.pool[self._next_doc % len(self.pool)]
        self._next_doc += 1
        return doc

    def whole_blocks(self, tokens: list[int], blocks: int) -> list[int]:
        need = blocks * self.bs
        if len(tokens) < need:
            raise ValueError(f"text too short for {blocks} blocks of {self.bs} tokens")
        return tokens[:need]

    def passage(self, doc: CorpusDocument, n: int, *, offset: int = 0) -> list[int]:
        tokens = self.doc_tokens(doc)
        start = offset % max(1, len(tokens) - n)
        out = tokens[start : start + n]
        if len(out) < n:
            raise ValueError(f"document {doc.doc_id} has fewer than {n} tokens")
        return out

    def question(self, doc: CorpusDocument) -> list[int]:
        words = [w.strip(".,:;()'\"") for w in doc.text.split() if len(w) > 6 and w.isascii()]
        word = self.rng.choice(words) if words else doc.title
        return self.tok.encode("\n\nQuestion: " + self.rng.choice(_QUESTIONS).format(w=word) + "\nAnswer:")

    def instruction(self, exclude: str | None = None) -> str:
        return self.rng.choice([s for s in _INSTRUCTIONS if s != exclude])

    def edit(self, tokens: Sequence[int], positions: Sequence[int]) -> list[int]:
        out = list(tokens)
        for p in positions:
            out[p] = (out[p] + 1 + self.rng.randrange(self.tok.vocab_size - 1)) % self.tok.vocab_size
        return out


def build_workload(tokenizer: TokenizerAdapter, *, block_size: int = 32, units: int = 4, seed: int = 0) -> Workload:
    """``units`` requests per kind (plus their donors), reproducible from ``seed``.

    The document passages are sized in blocks, so the workload scales with ``block_size``; block sizes above 64
    need longer documents than the corpus has and raise ValueError.
    """
    if units < 1:
        raise ValueError(f"units must be >= 1, got {units}")
    if not 1 <= block_size <= 64:
        raise ValueError(f"the bundled workload supports block sizes 1..64, got {block_size}")
    b = _Builder(tokenizer, block_size, seed)
    bs = block_size
    donors: list[WorkloadDonor] = []
    requests: list[WorkloadRequest] = []

    def donor(tokens: list[int], tenant: str = TENANT) -> str:
        donor_id = f"donor-{len(donors):04d}"
        donors.append(WorkloadDonor(donor_id=donor_id, tenant=tenant, tokens=tokens))
        return donor_id

    def request(kind: RequestKind, variant: str, tokens: list[int], related: list[str], tenant: str = TENANT) -> None:
        request_id = f"req-{len(requests):04d}-{kind.value}"
        requests.append(
            WorkloadRequest(
                request_id=request_id, kind=kind, variant=variant, tenant=tenant, tokens=tokens, related_donors=related
            )
        )

    for i in range(units):
        system = b.system[i % len(b.system)]

        # Exact prefix repeat: the same prompt again, or the same long prompt with a new short question.
        doc = b.next_doc()
        body = system + b.passage(doc, 16 * bs, offset=i * 97)
        d = donor(body + b.question(doc))
        if i % 2 == 0:
            request(RequestKind.EXACT_REPEAT, "verbatim", list(donors[-1].tokens), [d])
        else:
            request(RequestKind.EXACT_REPEAT, "new_question", body + b.question(doc), [d])

        # Same document, new question with a long attached follow-up: the shared prefix is under half the prompt.
        doc = b.next_doc()
        body = system + b.passage(doc, 10 * bs, offset=i * 31)
        d = donor(body + b.question(doc))
        follow_up = b.tok.encode("\n\nAlso consider this related excerpt:\n") + b.passage(
            b.held_out[i % len(b.held_out)], 12 * bs, offset=i * 53
        )
        request(RequestKind.SAME_DOC_NEW_QUESTION, "long_follow_up", body + b.question(doc) + follow_up, [d])

        # Instruction variant: same document, different instruction framing in front of it (unaligned lengths).
        doc = b.next_doc()
        passage = b.passage(doc, 14 * bs, offset=i * 13)
        first = b.instruction()
        d = donor(b.tok.encode(first + "\n\n") + passage + b.question(doc))
        second = b.instruction(exclude=first)
        request(
            RequestKind.INSTRUCTION_VARIANT,
            "new_framing",
            b.tok.encode(second + "\n\n") + passage + b.question(doc),
            [d],
        )

        # RAG chunk reorder: fixed-size chunks (whole blocks) from four documents, presented in another order.
        chunks = [b.passage(b.next_doc(), 4 * bs, offset=i * 17 + k * 211) for k in range(4)]
        d = donor(system + [t for c in chunks for t in c] + b.question(doc))
        order = [3, 1, 0, 2] if i % 2 == 0 else [2, 0, 3, 1]
        reordered = [t for k in order for t in chunks[k]]
        request(RequestKind.RAG_REORDER, "permuted_chunks", system + reordered + b.question(doc), [d])

        # Multi-donor composition: system + chunk from one donor, a longer section from another donor.
        doc_a, doc_b = b.next_doc(), b.next_doc()
        chunk_a = b.passage(doc_a, 4 * bs, offset=i * 7)
        section_b = b.passage(doc_b, 8 * bs, offset=i * 11)
        da = donor(system + chunk_a + b.question(doc_a))
        db = donor(b.tok.encode(b.instruction() + "\n") + section_b + b.question(doc_b))
        request(RequestKind.MULTI_DONOR, "two_donors", system + chunk_a + section_b + b.question(doc_b), [da, db])

        # Fuzzy edits: a few token edits late in the prompt (sparse), or one every ~24 tokens (dense).
        doc = b.next_doc()
        original = system + b.passage(doc, 14 * bs, offset=i * 41) + b.question(doc)
        d = donor(original)
        n = len(original)
        if i % 2 == 0:
            request(RequestKind.FUZZY_EDIT, "sparse", b.edit(original, [n // 2, 2 * n // 3, n - 10]), [d])
        else:
            request(RequestKind.FUZZY_EDIT, "dense", b.edit(original, range(5, n, 24)), [d])

        # Negative controls: an unrelated document, or a donor's exact prompt from another tenant.
        held = b.held_out[(i + 1) % len(b.held_out)]
        unrelated = b.tok.encode(b.instruction() + "\n\n") + b.passage(held, 12 * bs, offset=i * 29) + b.question(held)
        request(RequestKind.NEGATIVE_CONTROL, "unrelated_document", unrelated, [])
        request(RequestKind.NEGATIVE_CONTROL, "other_tenant", list(donors[i % len(donors)].tokens), [], OTHER_TENANT)

    # Bad input the pipeline must decline without an error.
    request(RequestKind.BAD_INPUT, "empty_prompt", [], [])
    request(RequestKind.BAD_INPUT, "shorter_than_a_block", b.tok.encode("Hi there."), [])
    request(RequestKind.BAD_INPUT, "unknown_namespace", list(donors[0].tokens), [], UNKNOWN_TENANT)
    return Workload(
        seed=seed, block_size=bs, tokenizer_fingerprint=tokenizer.fingerprint, donors=donors, requests=requests
    )
