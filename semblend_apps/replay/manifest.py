"""SemBench replay manifests (JSONL, ``sembench.manifest.v1``) as a replay :class:`~.workload.Workload`.

One JSON object per line is one item: the donor prompts to seed, then the recipient prompt (docs/sembench.md lists
the fields read). Prompts are tokenized with the configured tokenizer; every item's donors are seeded just before
its recipient, in file order, as SemBench replays them. All items share one tenant: items are isolated from each
other only by their content, exactly as on the engine SemBench drives.

A file that cannot be read raises :class:`ManifestError` with one line naming the file, the line and the problem.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from semblend_dynamo.tokenizer import TokenizerAdapter

from .workload import TENANT, RequestKind, Workload, WorkloadDonor, WorkloadRequest

__all__ = ["MANIFEST_VERSION", "ManifestError", "ManifestItem", "load_manifest", "manifest_sha256", "manifest_workload"]

MANIFEST_VERSION = "sembench.manifest.v1"

TRANSFORM_KINDS: dict[str, RequestKind] = {
    "exact_repeat": RequestKind.EXACT_REPEAT,
    "instruction_variant": RequestKind.INSTRUCTION_VARIANT,
    "same_evidence_new_task": RequestKind.SAME_DOC_NEW_QUESTION,
    "leading_evidence_new_task": RequestKind.SAME_DOC_NEW_QUESTION,
    "rag_reorder": RequestKind.RAG_REORDER,
    "multi_donor_composite": RequestKind.MULTI_DONOR,
    "fuzzy_edit": RequestKind.FUZZY_EDIT,
    "negative_control": RequestKind.NEGATIVE_CONTROL,
}
"""SemBench's transforms and the replay kind each exercises; any other transform replays as ``other``."""


class ManifestError(ValueError):
    """A manifest that cannot be replayed; the message is one line."""


class ManifestDonor(BaseModel):
    """One entry of an item's ``donor_prompts``."""

    model_config = ConfigDict(extra="ignore", strict=True)

    donor_id: str = Field(min_length=1)
    text: str
    label: str
    metadata: dict[str, Any] = Field(default_factory=dict)


class ManifestItem(BaseModel):
    """One manifest line (the fields replay reads; others are ignored)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    item_id: str = Field(min_length=1)
    dataset: str
    source_id: str
    transform: str = Field(min_length=1)
    donor_prompts: list[ManifestDonor]
    recipient_prompt: str
    input: str = ""
    answers: list[str] = Field(default_factory=list)
    negative_control: bool = False
    metadata: dict[str, Any] = Field(default_factory=dict)
    benchmark_version: str = MANIFEST_VERSION


def load_manifest(path: str | Path) -> list[ManifestItem]:
    """Parse and check a manifest file: valid items, unique item ids, one text per donor id."""
    where = str(path)
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ManifestError(f"manifest {where}: cannot read ({exc})") from None
    items: list[ManifestItem] = []
    seen_items: set[str] = set()
    donor_texts: dict[str, str] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ManifestError(f"manifest {where} line {number}: not JSON ({exc.msg})") from None
        if not isinstance(raw, dict):
            raise ManifestError(f"manifest {where} line {number}: not a JSON object")
        try:
            item = ManifestItem.model_validate(raw)
        except ValidationError as exc:
            err = exc.errors()[0]
            field = ".".join(str(p) for p in err["loc"]) or "item"
            raise ManifestError(f"manifest {where} line {number}: {field}: {err['msg']}") from None
        if not item.benchmark_version.startswith("sembench.manifest."):
            raise ManifestError(
                f"manifest {where} line {number}: benchmark_version {item.benchmark_version!r} is not a SemBench "
                f"manifest (expected {MANIFEST_VERSION})"
            )
        if item.item_id in seen_items:
            raise ManifestError(f"manifest {where} line {number}: item_id {item.item_id!r} repeats an earlier item")
        seen_items.add(item.item_id)
        for donor in item.donor_prompts:
            if donor_texts.setdefault(donor.donor_id, donor.text) != donor.text:
                raise ManifestError(
                    f"manifest {where} line {number}: donor_id {donor.donor_id!r} names two different texts"
                )
        items.append(item)
    if not items:
        raise ManifestError(f"manifest {where}: no items")
    return items


def manifest_workload(
    items: list[ManifestItem], tokenizer: TokenizerAdapter, *, block_size: int, tenant: str = TENANT
) -> Workload:
    """The replay workload of a manifest: each item's donors seeded before its recipient, in file order."""
    donors: dict[str, WorkloadDonor] = {}
    requests: list[WorkloadRequest] = []
    for item in items:
        for donor in item.donor_prompts:
            if donor.donor_id not in donors:
                donors[donor.donor_id] = WorkloadDonor(
                    donor_id=donor.donor_id, tenant=tenant, tokens=tokenizer.encode(donor.text)
                )
        donor_ids = list(dict.fromkeys(d.donor_id for d in item.donor_prompts))
        negative = item.negative_control or item.transform == "negative_control"
        requests.append(
            WorkloadRequest(
                request_id=item.item_id,
                kind=RequestKind.NEGATIVE_CONTROL
                if negative
                else TRANSFORM_KINDS.get(item.transform, RequestKind.OTHER),
                variant=item.dataset,
                tenant=tenant,
                tokens=tokenizer.encode(item.recipient_prompt),
                related_donors=[] if negative else donor_ids,
                seed_donors=donor_ids,
                transform=item.transform,
            )
        )
    return Workload(
        seed=0,
        block_size=block_size,
        tokenizer_fingerprint=tokenizer.fingerprint,
        donors=list(donors.values()),
        requests=requests,
    )


def manifest_sha256(path: str | Path) -> str:
    """SHA-256 of the manifest's bytes (SemBench identifies a manifest by it)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
