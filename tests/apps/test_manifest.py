"""SemBench manifests in: the fixture, its workload, one-line errors for bad files, and donor coverage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from semblend_apps.cli import main
from semblend_apps.replay.coverage import DonorCoverage
from semblend_apps.replay.manifest import ManifestError, load_manifest, manifest_workload
from semblend_apps.replay.workload import RequestKind
from semblend_dynamo.tokenizer import TokenizerAdapter
from tests.support.sembench_fixture import FIXTURE_PATH, render


def test_committed_fixture_is_what_the_generator_writes() -> None:
    assert FIXTURE_PATH.read_text(encoding="utf-8") == render()


def test_fixture_becomes_a_workload_seeding_each_items_donors() -> None:
    items = load_manifest(FIXTURE_PATH)
    tok = TokenizerAdapter.bundled()
    workload = manifest_workload(items, tok, block_size=32)
    assert [r.request_id for r in workload.requests] == [i.item_id for i in items]
    assert len(workload.donors) == sum(len(i.donor_prompts) for i in items)
    for item, request in zip(items, workload.requests, strict=True):
        assert request.transform == item.transform
        assert request.seed_donors == [d.donor_id for d in item.donor_prompts]
        assert request.tokens == tok.encode(item.recipient_prompt)
        if item.negative_control:
            assert request.kind is RequestKind.NEGATIVE_CONTROL and request.related_donors == []
        else:
            assert request.related_donors == request.seed_donors
    kinds = {r.transform: r.kind for r in workload.requests}
    assert kinds["multi_donor_composite"] is RequestKind.MULTI_DONOR
    assert kinds["leading_evidence_new_task"] is RequestKind.SAME_DOC_NEW_QUESTION


def _line(**overrides: object) -> str:
    item: dict[str, object] = {
        "item_id": "a",
        "dataset": "d",
        "source_id": "s",
        "transform": "exact_repeat",
        "donor_prompts": [{"donor_id": "x", "label": "base_prompt", "text": "hello"}],
        "recipient_prompt": "hello",
    }
    item.update(overrides)
    return json.dumps({k: v for k, v in item.items() if v is not None})


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([_line(), "{not json"], "line 2: not JSON"),
        (["[1, 2]"], "line 1: not a JSON object"),
        ([_line(recipient_prompt=None)], "line 1: recipient_prompt: Field required"),
        ([_line(negative_control="yes")], "line 1: negative_control: Input should be a valid boolean"),
        ([_line(donor_prompts=[{"donor_id": "x", "text": "t"}])], "line 1: donor_prompts.0.label: Field required"),
        ([_line(), "", _line()], "line 3: item_id 'a' repeats an earlier item"),
        ([_line(), _line(item_id="b", donor_prompts=[{"donor_id": "x", "label": "l", "text": "other"}])], "line 2: "),
        ([_line(benchmark_version="other.v1")], "line 1: benchmark_version 'other.v1' is not a SemBench manifest"),
        ([""], "no items"),
    ],
)
def test_bad_manifests_fail_with_one_line_naming_the_line(tmp_path: Path, lines: list[str], message: str) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(ManifestError) as err:
        load_manifest(path)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert str(path) in str(err.value)


def test_replay_cli_reports_a_bad_manifest_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text(_line() + "\n{\n", encoding="utf-8")
    argv = ["replay", "--backend", "none", "--embedder", "hash", "--audit-path", str(tmp_path / "a.jsonl")]
    assert main([*argv, "--manifest", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("semblend-dynamo replay: manifest ") and "line 2: not JSON" in err
    assert len(err.splitlines()) == 1
    assert main([*argv, "--manifest", str(tmp_path / "missing.jsonl")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_plan_only_replay_of_the_fixture_reports_by_transform(tmp_path: Path, capsys) -> None:
    argv = ["replay", "--json", "--backend", "none", "--embedder", "hash", "--audit-path", str(tmp_path / "a.jsonl")]
    assert main([*argv, "--manifest", str(FIXTURE_PATH)]) == 0
    data = json.loads(capsys.readouterr().out)
    rows = data["by_transform"]
    assert sum(r["requests"] for r in rows.values()) == data["workload"]["requests"] == 12
    assert rows["multi_donor_composite"]["materialized"] == 1  # without a backend: plans that would load
    assert rows["negative_control"]["false_positives"] == 0 and "false_positives" not in rows["exact_repeat"]


def test_donor_coverage_counts_tokens_inside_exact_donor_windows() -> None:
    cov = DonorCoverage(4)
    cov.add("ns", [1, 2, 3, 4, 5, 6, 7, 8])
    assert cov.covered("ns", [9, 1, 2, 3, 4, 5, 0, 6, 7, 8]) == 5  # 1..5 only: 6,7,8 is shorter than a window
    assert cov.covered("ns", [5, 6, 7, 8, 1, 2, 3, 4]) == 8  # order does not matter, positions do not either
    assert cov.covered("other", [1, 2, 3, 4]) == 0  # namespaces never mix
    assert cov.covered("ns", [1, 2, 3]) == 0
