"""The quality workload is a valid SemBench manifest with every transform and answers taken from the evidence."""

from __future__ import annotations

from pathlib import Path

from benchmarks.quality import workload
from benchmarks.quality.metrics import acceptable, rouge_l
from semblend_apps.replay.manifest import load_manifest


def _words(text: str) -> int:  # a tokenizer stand-in: whitespace words
    return len(text.split())


def test_manifest_round_trips_through_replays_reader(tmp_path: Path) -> None:
    recs = list(workload.records([300, 400, 500], _words))
    items = workload.build(recs)
    path = tmp_path / "m.jsonl"
    workload.write_manifest(path, items)
    loaded = load_manifest(path)
    assert [i.transform for i in loaded] == [i["transform"] for i in items]
    assert {i.transform for i in loaded} == set(workload.TRANSFORMS)
    for item in loaded:
        answer = item.answers[0]
        assert answer and " ".join(answer.split()) in " ".join(item.recipient_prompt.split()).replace(".\n", ". ")
        assert item.negative_control == (item.transform == "negative_control")
        if item.transform == "multi_donor_composite":
            assert len(item.donor_prompts) == workload.SEGMENTS
        if item.transform == "negative_control":
            assert item.donor_prompts[0].metadata["negative_source_id"] != item.source_id


def test_evidence_is_sized_to_its_budget() -> None:
    recs = list(workload.records([300, 900, 2000, 2000], _words))  # a stretch with no entry to ask about is skipped
    assert len(recs) >= 3
    for rec in recs:
        budget = int(rec.source_id.split("-")[-2])
        assert budget / 2 <= sum(_words(p) + 2 for p in rec.paragraphs) <= budget


def test_rouge_l_and_the_quality_bar() -> None:
    assert rouge_l("the cat sat", "the cat sat") == 1.0
    assert rouge_l("", "x") == 0.0
    assert 0.0 < rouge_l("the cat sat on a mat", "a cat sat") < 1.0
    assert acceptable(0.05, 0.98, 1.0) and not acceptable(0.051, 1.0, 1.0) and not acceptable(0.0, 0.97, 1.0)
