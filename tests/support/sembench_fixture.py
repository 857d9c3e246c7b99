"""Writes tests/data/sembench-fixture.jsonl: a small manifest in SemBench's format, from the bundled corpus.

``python -m tests.support.sembench_fixture`` regenerates it (deterministic); a test checks the committed file
matches. Every SemBench transform is present, negative controls included. Two items reuse one document so that a
donor prefill has an earlier donor it could load from: the audit must still not count it as reuse.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any

from semblend_apps.replay.workload import load_corpus

FIXTURE_PATH = Path(__file__).resolve().parents[1] / "data" / "sembench-fixture.jsonl"

_HEADER = "Workspace evidence review\n\nUse the source material below to answer the user request.\n\nSource material:\n"
_ANALYST = "You are an analyst preparing a concise internal response.\n\nEvidence packet:\n"


def _passage(text: str, start: int, chars: int) -> str:
    begin = text.find("\n", start) + 1
    return text[begin : begin + chars].strip()


def _prompt(header: str, evidence: str, question: str) -> str:
    return f"{header}{evidence}\n\nUser request:\n{question}\n\nAnswer:"


def _donor_id(item: str, k: int, text: str) -> str:
    return hashlib.sha256(f"{item}/{k}/{text}".encode()).hexdigest()[:16]


def _item(
    item_id: str, transform: str, source: str, donors: list[str], recipient: str, question: str
) -> dict[str, Any]:
    return {
        "answers": [],
        "benchmark_version": "sembench.manifest.v1",
        "dataset": "semblend-fixture",
        "donor_prompts": [
            {"donor_id": _donor_id(item_id, k, t), "label": "base_prompt", "metadata": {}, "text": t}
            for k, t in enumerate(donors)
        ],
        "input": question,
        "item_id": item_id,
        "metadata": {"expected_exact": transform == "exact_repeat"},
        "negative_control": transform == "negative_control",
        "recipient_prompt": recipient,
        "source_id": source,
        "transform": transform,
    }


def build_items() -> list[dict[str, Any]]:
    docs = {d.doc_id: d.text for d in load_corpus()}
    rng = random.Random(14)
    q = "What does this part of the documentation describe, and what are its limits?"
    q2 = "Which functions are mentioned, and when should each be used?"
    items: list[dict[str, Any]] = []

    def add(transform: str, source: str, donors: list[str], recipient: str, question: str = q) -> None:
        items.append(_item(f"fixture-{len(items):02d}-{transform}", transform, source, donors, recipient, question))

    for doc in ("argparse", "logging"):
        p = _prompt(_HEADER, _passage(docs[doc], 200, 2400), q)
        add("exact_repeat", doc, [p], p)
    # same document as the first exact_repeat: this item's donor prefill shares a long prefix with that donor
    ev = _passage(docs["argparse"], 200, 2400)
    add("same_evidence_new_task", "argparse", [_prompt(_HEADER, ev, q2)], _prompt(_HEADER, ev, q))
    ev = _passage(docs["socket"], 500, 2400)
    # the evidence leads the recipient but not its donor: in shifted mode a RoPE-corrected load from position 0
    lead = "Background reading for the on-call team.\n\n"
    add("leading_evidence_new_task", "socket", [lead + ev + "\n\nSummarize the text above."], ev + "\n\n" + q2)
    for doc in ("threading", "tarfile"):
        ev = _passage(docs[doc], 300, 2400)
        add("instruction_variant", doc, [_prompt(_HEADER, ev, q)], _prompt(_ANALYST, ev, q))
    for sources in (("shutil", "inspect", "codecs"), ("subprocess", "statistics", "ftplib")):
        chunks = [_passage(docs[s], 700, 900) for s in sources]
        order = [2, 0, 1]
        add(
            "rag_reorder",
            "+".join(sources),
            [_prompt(_HEADER, "\n\n".join(chunks), q)],
            _prompt(_HEADER, "\n\n".join(chunks[k] for k in order), q),
        )
    a, b = _passage(docs["configparser"], 400, 1200), _passage(docs["imaplib"], 400, 1600)
    add(
        "multi_donor_composite",
        "configparser+imaplib",
        [_prompt(_HEADER, a, q2), "Read the following reference carefully.\n" + b + "\n\nSummarize it."],
        _prompt(_HEADER, a + "\n\n" + b, q),
    )
    ev = _passage(docs["pdb"], 300, 2400)
    words = ev.split(" ")
    for k in sorted(rng.sample(range(len(words) // 2, len(words)), 3)):
        words[k] = words[k].upper()
    add("fuzzy_edit", "pdb", [_prompt(_HEADER, ev, q)], _prompt(_HEADER, " ".join(words), q))
    for donor_doc, target_doc in (("os", "turtle"), ("re", "smtplib")):
        add(
            "negative_control",
            target_doc,
            [_prompt(_HEADER, _passage(docs[donor_doc], 300, 2400), q)],
            _prompt(_HEADER, _passage(docs[target_doc], 300, 2400), q),
        )
    return items


def render() -> str:
    return "".join(json.dumps(item, ensure_ascii=False, sort_keys=True) + "\n" for item in build_items())


if __name__ == "__main__":
    FIXTURE_PATH.write_text(render(), encoding="utf-8")
    print(f"wrote {FIXTURE_PATH}")
