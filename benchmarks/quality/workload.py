"""A SemBench-format workload built from the bundled corpus: every transform, questions answered by the evidence.

Each record is a stretch of the bundled CPython docstring corpus (``semblend_dynamo/data/corpus``) sized to a token
budget, and a question about one entry in it ("what does ``copyfile`` do?") whose answer is the first sentence of
that entry's docstring, so the answer is always in the evidence. From each record every SemBench transform builds one
replay item (donor prompts, a recipient prompt): the manifest is JSONL in SemBench's ``sembench.manifest.v1`` schema
(``item_id``, ``dataset``, ``source_id``, ``transform``, ``donor_prompts`` [``donor_id``, ``text``, ``label``,
``metadata``], ``recipient_prompt``, ``input``, ``answers``, ``negative_control``, ``metadata``,
``benchmark_version``).

Prompts are user messages; :func:`chat_tokens` wraps them in SmolLM2's ChatML template with :data:`SYSTEM_PROMPT`,
which is exactly :data:`SYSTEM_BLOCKS` KV blocks long so that content right after it starts on a block boundary
(TensorRT-LLM loads whole blocks: a donor span that starts inside a block cannot be tiled after the system prompt).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from semblend_apps.replay.manifest import MANIFEST_VERSION

TRANSFORMS = (
    "exact_repeat",
    "instruction_variant",
    "same_evidence_new_task",
    "leading_evidence_new_task",
    "rag_reorder",
    "multi_donor_composite",
    "fuzzy_edit",
    "negative_control",
)
CORPUS = Path(__file__).resolve().parents[2] / "semblend_dynamo" / "data" / "corpus"
DATASET = "cpython-docstrings"
SYSTEM_PROMPT = (
    "You are a precise assistant for Python standard library documentation. Answer the user's question using only "
    "the source material in the user's message. Quote the relevant sentence of the documentation when it answers "
    "the question. Keep answers to one or two sentences and do not speculate beyond the text."
)
SYSTEM_BLOCKS = 2
"""``<|im_start|>system ... <|im_end|>\\n<|im_start|>user\\n`` is this many 32-token blocks (checked by the tests)."""
SEGMENTS = 4

_NAME = re.compile(r"[A-Za-z_][\w.]*")


@dataclass(frozen=True)
class Record:
    """One stretch of evidence and a question it answers."""

    source_id: str
    paragraphs: list[str]
    question: str
    answer: str

    @property
    def context(self) -> str:
        return "\n\n".join(self.paragraphs)

    def segments(self, n: int = SEGMENTS) -> list[str]:
        """The evidence split at paragraph boundaries into ``n`` parts of about equal length."""
        total = sum(len(p) for p in self.paragraphs)
        out: list[list[str]] = [[]]
        done = 0
        for p in self.paragraphs:
            if out[-1] and done >= total * len(out) / n and len(out) < n:
                out.append([])
            out[-1].append(p)
            done += len(p)
        return ["\n\n".join(s) for s in out]


def _paragraphs(path: Path) -> list[str]:
    return [p.strip() for p in re.split(r"\n\s*\n", path.read_text(encoding="utf-8")) if p.strip()]


def _first_sentence(text: str) -> str:
    flat = re.sub(r"\s+", " ", text).strip()
    match = re.match(r"(.+?[.!?])(\s|$)", flat)
    return match.group(1) if match else flat


def _entries(paragraphs: Sequence[str]) -> list[int]:
    """Indices of paragraphs that name an API entry followed by a description whose first sentence is a real one."""
    out = []
    for i in range(len(paragraphs) - 1):
        if _NAME.fullmatch(paragraphs[i]) and 6 <= len(_first_sentence(paragraphs[i + 1]).split()) <= 30:
            out.append(i)
    return out


def records(token_budgets: Sequence[int], count_tokens: Any, corpus: Path = CORPUS) -> Iterator[Record]:
    """One record per budget, cycling through the corpus documents; evidence is about ``budget`` tokens long.

    ``count_tokens(text) -> int`` measures with the model's tokenizer. A record that needs more text than its
    document holds continues into the next document. The question asks about an entry in the middle half.
    """
    docs = sorted(p for p in corpus.glob("*.txt"))
    for n, budget in enumerate(token_budgets):
        first = n % len(docs)
        paragraphs: list[str] = []
        used = 0
        k = 0
        while used < budget:
            for p in _paragraphs(docs[(first + k) % len(docs)]):
                size = count_tokens(p) + 2
                if used + size > budget and paragraphs:
                    used = budget
                    break
                paragraphs.append(p)
                used += size
            k += 1
        entries = _entries(paragraphs)
        if not entries:
            continue
        entry = entries[len(entries) // 2]
        name = paragraphs[entry]
        yield Record(
            source_id=f"{docs[first].stem}-{budget}-{n}",
            paragraphs=paragraphs,
            question=f"According to the source material, what does `{name}` do? Answer in one sentence.",
            answer=_first_sentence(paragraphs[entry + 1]),
        )


def stable_id(*parts: str) -> str:
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:16]


def _base(r: Record) -> str:
    return f"Source material:\n{r.context}\n\nQuestion: {r.question}"


def _instruction_variant(r: Record) -> str:
    return f"Read the documentation excerpt below carefully.\n\nExcerpt:\n{r.context}\n\nTask: {r.question}"


def _new_task(r: Record) -> str:
    return f"Task: {r.question} Then list two related functions.\n\nEvidence:\n{r.context}"


def _leading_evidence(r: Record) -> str:
    return f"{r.context}\n\nUsing only the evidence above, answer the request.\nRequest: {r.question}"


def _leading_donor(r: Record, n: int) -> str:
    # the header length varies from item to item, so the shifted span's position delta does too
    tags = " ".join(f"tag{i}=value{i}" for i in range(1 + n % 5 * 6))
    return f"Reusable evidence cache entry [{tags}]\n\n{r.context}\n\nSummarize the evidence."


def _reordered(r: Record) -> str:
    return "\n\n".join(reversed(r.segments())) + f"\n\nQuestion: {r.question}"


def _segment_donor(segment: str, i: int) -> str:
    return f"Cached evidence segment {i + 1}\n\n{segment}\n\nSummarize the segment."


def _composite(r: Record) -> str:
    return "\n\n".join(r.segments()) + f"\n\nSynthesize across the documents above. Question: {r.question}"


def _fuzzy(r: Record) -> str:
    edited = re.sub(r"\s+", " ", r.context).replace(". ", ".\n")
    return f"Source material:\n{edited}\n\nQuestion: {r.question}"


def item(r: Record, transform: str, n: int, unrelated: Record) -> dict[str, Any]:
    """The SemBench replay item of ``transform`` over ``r`` (``unrelated`` feeds the negative control's donor)."""
    item_id = stable_id(DATASET, r.source_id, transform)

    def donor(text: str, label: str, k: int = 0, **meta: Any) -> dict[str, Any]:
        return {"donor_id": stable_id(item_id, "donor", str(k)), "text": text, "label": label, "metadata": meta}

    donors = [donor(_base(r), "base_prompt")]
    recipient, negative, meta = _base(r), False, {}
    if transform == "exact_repeat":
        meta = {"expected_exact": True}
    elif transform == "instruction_variant":
        recipient = _instruction_variant(r)
    elif transform == "same_evidence_new_task":
        recipient = _new_task(r)
    elif transform == "leading_evidence_new_task":
        donors = [donor(_leading_donor(r, n), "leading_evidence_donor")]
        recipient = _leading_evidence(r)
    elif transform == "rag_reorder":
        recipient = _reordered(r)
    elif transform == "multi_donor_composite":
        donors = [donor(_segment_donor(s, i), "segment_donor", i, segment_index=i) for i, s in enumerate(r.segments())]
        recipient = _composite(r)
    elif transform == "fuzzy_edit":
        recipient = _fuzzy(r)
    elif transform == "negative_control":
        donors = [donor(_base(unrelated), "unrelated_base_prompt", negative_source_id=unrelated.source_id)]
        recipient = _instruction_variant(r)
        negative, meta = True, {"expected_semantic": False, "negative_source_id": unrelated.source_id}
    else:
        raise ValueError(f"unknown transform: {transform}")
    return {
        "item_id": item_id,
        "dataset": DATASET,
        "source_id": r.source_id,
        "transform": transform,
        "donor_prompts": donors,
        "recipient_prompt": recipient,
        "input": r.question,
        "answers": [r.answer],
        "negative_control": negative,
        "metadata": meta,
        "benchmark_version": MANIFEST_VERSION,
    }


def build(recs: Sequence[Record], transforms: Iterable[str] = TRANSFORMS) -> list[dict[str, Any]]:
    """Items ordered by record, one per transform (records[i + 1] is record i's unrelated donor)."""
    wanted = list(transforms)
    return [
        item(r, t, n, recs[(n + 1) % len(recs)])
        for n, r in enumerate(recs)
        for t in wanted
        if len(recs) > 1 or t != "negative_control"
    ]


def write_manifest(path: Path, items: Sequence[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(i, ensure_ascii=False, sort_keys=True) + "\n" for i in items), encoding="utf-8")


def read_manifest(path: Path) -> list[dict[str, Any]]:
    """Items of a SemBench manifest, checked by replay's reader (:class:`ManifestError` with one clear line)."""
    from semblend_apps.replay.manifest import load_manifest

    return [item.model_dump() for item in load_manifest(path)]


def chat_tokens(tokenizer: Any, user_text: str) -> list[int]:
    """``user_text`` as SmolLM2 sees it: ChatML with :data:`SYSTEM_PROMPT`, ready for the assistant's turn."""
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user_text}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def system_prefix_tokens(tokenizer: Any) -> int:
    """Tokens every prompt shares before the user's text."""
    a, b = chat_tokens(tokenizer, "x y z"), chat_tokens(tokenizer, "q r s")
    return next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
