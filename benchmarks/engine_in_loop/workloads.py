"""Engine-in-the-loop workloads built in token space from held-out documents.

Every case names its donor prompts (prefilled and registered first), the target prompt, a held-out continuation
of the target (teacher-forced to measure KL, top-1 agreement and perplexity) and the ground truth of what could be
reused: the target tokens that are token-exact copies of donor tokens, and at which position delta.

Kinds:

- ``exact_prefix``: the target repeats a donor's leading document and continues it (exact-equivalent KV).
- ``new_question``: same document, a different short question after it.
- ``reordered_rag``: a shared header then the donor's RAG chunks in another order (shifted spans, delta != 0).
- ``shifted``: the donor carries the document after ``delta`` tokens of unrelated text; the target starts with
  it (position delta ``-delta``, and the donor's KV of the document attended to text the target never saw).
- ``negative``: the donor is unrelated text; nothing may be materialized.

Prompts are cut from token streams, not re-tokenized, so token-exact spans are exact by construction.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

CaseKind = Literal["exact_prefix", "new_question", "reordered_rag", "shifted", "negative"]


class Case(BaseModel):
    """One target request, its donors and what a perfect planner could reuse."""

    name: str
    kind: CaseKind
    donors: list[list[int]]
    prompt: list[int]
    continuation: list[int]
    reusable_prefix_tokens: int = Field(description="target prefix tokens that are token-exact copies of donor tokens")
    position_delta: int = Field(description="target position minus donor position of the reused content (first span)")
    target_share: float = Field(0.0, description="reusable prefix / prompt length as designed")


class TokenSource:
    """Held-out documents as token lists, handed out without reuse: every token is given out at most once.

    The first ``skip_head`` tokens of each document are never used, so the license headers and boilerplate that
    many source files share do not create accidental matches between unrelated cases.
    """

    def __init__(self, docs: list[list[int]], *, skip_head: int = 128) -> None:
        self._docs = [d[skip_head:] for d in docs if len(d) > skip_head]
        self._cursor = [0] * len(self._docs)
        self._next = 0

    def take(self, n: int) -> list[int]:
        """``n`` consecutive unused tokens of one document (the next one, in turn, with that many left)."""
        for _ in range(len(self._docs)):
            i = self._next % len(self._docs)
            self._next += 1
            if len(self._docs[i]) - self._cursor[i] >= n:
                start = self._cursor[i]
                self._cursor[i] += n
                return self._docs[i][start : start + n]
        raise ValueError(f"no held-out document has {n} unused tokens left")

    def take_joined(self, n: int) -> list[int]:
        """``n`` unused tokens, joining the remainders of several documents."""
        out: list[int] = []
        for _ in range(len(self._docs)):
            if len(out) >= n:
                break
            i = self._next % len(self._docs)
            self._next += 1
            piece = self._docs[i][self._cursor[i] : self._cursor[i] + n - len(out)]
            self._cursor[i] += len(piece)
            out.extend(piece)
        if len(out) < n:
            raise ValueError(f"held-out documents have fewer than {n} unused tokens left")
        return out


def load_heldout(path: Path, tokenizer, limit: int = 400) -> list[list[int]]:
    """Token ids of the held-out documents written by ``train_small_llama.py``."""
    texts = [json.loads(line)["text"] for line in path.read_text().splitlines()[:limit]]
    return [enc.ids for enc in tokenizer.backend_tokenizer.encode_batch(texts)]


def fidelity_cases(
    src: TokenSource,
    *,
    prompt_tokens: int,
    continuation_tokens: int,
    shares: tuple[float, ...],
    deltas: tuple[int, ...],
    rag_chunk_tokens: int,
    header_tokens: int,
) -> Iterator[Case]:
    """The trained-model fidelity suite: every kind, and a shifted sweep over shares x deltas."""
    n, c = prompt_tokens, continuation_tokens

    doc = src.take(n + c)
    yield Case(
        name="exact_prefix",
        kind="exact_prefix",
        donors=[doc[: int(n * 0.9)] + src.take(64)],
        prompt=doc[:n],
        continuation=doc[n:],
        reusable_prefix_tokens=int(n * 0.9),
        position_delta=0,
        target_share=0.9,
    )

    doc = src.take(n)
    question, other = src.take(64 + c), src.take(64)
    shared = n - 64
    yield Case(
        name="new_question",
        kind="new_question",
        donors=[doc[:shared] + other],
        prompt=doc[:shared] + question[:64],
        continuation=question[64:],
        reusable_prefix_tokens=shared,
        position_delta=0,
        target_share=shared / n,
    )

    header = src.take(header_tokens)
    chunks = [src.take(rag_chunk_tokens) for _ in range(3)]
    question = src.take(64 + c)
    a, b, cc = chunks
    target_prompt = header + b + a + cc + question[:64]
    yield Case(
        name="reordered_rag",
        kind="reordered_rag",
        donors=[header + a + b + cc + src.take(64)],
        prompt=target_prompt,
        continuation=question[64:],
        reusable_prefix_tokens=header_tokens + 3 * rag_chunk_tokens,
        position_delta=-len(a),
        target_share=(header_tokens + 3 * rag_chunk_tokens) / len(target_prompt),
    )

    for delta in deltas:
        for share in shares:
            doc = src.take(n + c)
            reused = int(n * share)
            yield Case(
                name=f"shifted_d{delta}_s{int(share * 100)}",
                kind="shifted",
                donors=[src.take_joined(delta) + doc[:reused]],
                prompt=doc[:n],
                continuation=doc[n:],
                reusable_prefix_tokens=reused,
                position_delta=-delta,
                target_share=share,
            )

    doc = src.take(n + c)
    yield Case(
        name="negative_unrelated",
        kind="negative",
        donors=[src.take(n)],
        prompt=doc[:n],
        continuation=doc[n:],
        reusable_prefix_tokens=0,
        position_delta=0,
        target_share=0.0,
    )


def speed_cases(
    vocab_size: int, prompt_tokens: int, share: float, *, repeats: int, seed: int, shift: int = 0
) -> list[Case]:
    """Random-token targets whose first ``share`` of tokens repeat their own donor (``shift`` positions later in it).

    Each case has its own donor and shared span, so a finished target (itself a donor) offers nothing to a later one:
    every target loads from its donor at delta ``-shift`` (a shared span would be found in an earlier target at delta
    0, and shifted mode would time an unrotated copy).
    """
    import random

    rng = random.Random(seed)

    def draw(n: int) -> list[int]:
        return [rng.randrange(100, vocab_size) for _ in range(n)]

    reused = int(prompt_tokens * share)
    cases = []
    for r in range(repeats):
        shared = draw(reused)
        cases.append(
            Case(
                name=f"speed_{prompt_tokens}_s{int(share * 100)}_d{shift}_r{r}",
                kind="shifted" if shift else "exact_prefix",
                donors=[draw(shift) + shared + draw(64)],
                prompt=shared + draw(prompt_tokens - reused),
                continuation=[],
                reusable_prefix_tokens=reused,
                position_delta=-shift,
                target_share=share,
            )
        )
    return cases
