"""The compiled accepting path (semblend_dynamo/_native/planner.c) accepts exactly when the Python planner accepts.

The module is built for this interpreter into a temporary folder (skipped without a C compiler and Python headers).
For random spans, prefixes, similarities, chain heads and gate settings (test_planner_reference's strategies) its
answer is None when the Python planner declines (or ``discovery_only`` holds), but for the ``exact_only_mode`` decline,
which it makes itself (the router's usual decline of shifted spans) or leaves to the Python planner, and otherwise the
Python planner's decision: the same spans (the caller's own objects where unclipped), counts, mode and float bits.
"""

from __future__ import annotations

import dataclasses
import random
import shutil
import sysconfig
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from semblend_dynamo import native_planner, planner
from semblend_dynamo.config import SemblendConfig
from semblend_dynamo.outcomes import DeclineReason
from semblend_dynamo.planner import MaterializationPlan, PlanDecision, Planner
from semblend_dynamo.span_aligner import Span
from tests.core.test_planner_reference import BS, configs_st, plan_kwargs, spans_st, summary

SETUP = (
    Span,
    MaterializationPlan,
    PlanDecision,
    sum,
    (
        planner.BOUNDARY_DECAY_TOKENS,
        planner.CONTEXT_FLOOR,
        planner.ROPE_NUMERIC,
        planner.DISPLACEMENT_WEIGHT,
        planner.DISPLACEMENT_TOKENS,
    ),
    DeclineReason.EXACT_ONLY_MODE,
    planner.EXACT_ONLY_DETAIL,
)


def same_decline(got: Any, expected: PlanDecision) -> bool:
    """Whether the compiled path's answer to a declined case is right: None, or for ``exact_only_mode`` the Python
    planner's decline itself (reason, detail, no plan); True when it made that decline."""
    if got is None:
        return False
    assert expected.reason is DeclineReason.EXACT_ONLY_MODE, expected.reason
    assert isinstance(got, PlanDecision)
    assert (got.plan, got.reason, got.detail) == (None, expected.reason, expected.detail)
    return True


@pytest.fixture(scope="module")
def accept(tmp_path_factory: pytest.TempPathFactory) -> native_planner.Accept:
    if shutil.which("cc") is None or not Path(sysconfig.get_paths()["include"], "Python.h").exists():
        pytest.skip("no C compiler or no Python headers")
    suffix = native_planner.module_path().name.removeprefix("_planner")
    path = native_planner.build(tmp_path_factory.mktemp("planner") / f"_planner{suffix}")
    function, reason = native_planner.load(path, SETUP)
    assert function is not None, reason
    return function


def python_decision(cfg: SemblendConfig, target_len: Any, spans: Any, **kwargs: Any) -> PlanDecision:
    """The Python planner's decision (the compiled path off)."""
    saved, planner.NATIVE_ACCEPT = planner.NATIVE_ACCEPT, None
    try:
        return Planner(cfg).plan(target_len, spans, **kwargs)
    finally:
        planner.NATIVE_ACCEPT = saved


def native_decision(accept: native_planner.Accept, cfg: SemblendConfig, target_len: Any, spans: Any, **kw: Any) -> Any:
    return accept(
        cfg,
        target_len,
        spans,
        kw.get("similarity"),
        kw.get("device_prefix_tokens", 0),
        kw.get("approximate_donors", ()),
        kw.get("chain_head_tokens"),
    )


@st.composite
def tiled_spans(draw: st.DrawFn) -> list[Span]:
    """Spans one after another from a start near 0, each moved by a delta or not: mostly plans the gates accept."""
    pos = draw(st.sampled_from([0, 0, 0, 5, 32, 64]))
    out = []
    for _ in range(draw(st.integers(1, 5))):
        length = draw(st.one_of(st.integers(1, 40).map(lambda blocks: 32 * blocks), st.integers(1, 1200)))
        delta = draw(st.sampled_from([0, 0, 0, 40, -40, 17, 300, -700, 2500]))
        out.append(Span(draw(st.sampled_from(["a", "b", "c"])), max(0, pos - delta), pos, length))
        pos = max(0, pos + length + draw(st.sampled_from([0, 0, 0, 0, 3, -2])))
    return draw(st.permutations(out))


accepting_configs_st = st.fixed_dictionaries(
    {
        "exact_materialization_only": st.booleans(),
        "strict_prefix_boundary": st.booleans(),
        "discovery_only": st.sampled_from([False, False, False, True]),
        "min_span_tokens": st.sampled_from([32, 1, 64, 200]),
        "min_reuse_ratio": st.sampled_from([0.0, 0.05, 0.3]),
        "max_spans": st.sampled_from([8, 2, 1]),
        "max_deviation": st.sampled_from([1.0, 0.6, 0.35]),
        "min_similarity": st.sampled_from([0.0, 0.5]),
        "isolation": st.sampled_from(["no_block_reuse", "cache_salt", "none"]),
    }
)


@settings(max_examples=3000, deadline=None)
@given(
    cfg=st.one_of(accepting_configs_st, accepting_configs_st, configs_st),
    spans=st.one_of(tiled_spans(), tiled_spans(), spans_st),
    target_len=st.sampled_from([8192, 4096, 2048, 1500, 1024, 513, 200, 64, 33, 32, 1, 0]),
    device_blocks=st.sampled_from([0, 0, 0, 1, 2, 20]),
    device_offset=st.sampled_from([0, 0, 0, 5]),
    similarity=st.one_of(st.none(), st.floats(0.0, 1.0)),
    approximate=st.one_of(st.sets(st.sampled_from(["a", "b", "c"])), st.just(())),
    chain_head=st.one_of(st.none(), st.integers(0, 64)),
)
def test_it_accepts_what_the_python_planner_accepts_with_the_same_decision(
    accept: native_planner.Accept,
    cfg: dict[str, Any],
    spans: list[Span],
    target_len: int,
    device_blocks: int,
    device_offset: int,
    similarity: float | None,
    approximate: set[str],
    chain_head: int | None,
) -> None:
    config = SemblendConfig(block_size=BS).model_copy(update=cfg)
    kwargs = plan_kwargs(device_blocks, device_offset, similarity, approximate, chain_head)
    expected = python_decision(config, target_len, spans, **kwargs)
    got = native_decision(accept, config, target_len, spans, **kwargs)
    if expected.reason is not None:  # every decline (discovery_only's included) but exact_only_mode is Python's to make
        same_decline(got, expected)
        return
    assert isinstance(got, PlanDecision) and got.detail == ""
    assert summary(got) == summary(expected)
    assert got.plan is not None and expected.plan is not None
    for mine, theirs in zip(got.plan.spans, expected.plan.spans, strict=True):
        assert (mine is theirs) == any(mine is s for s in spans)  # the caller's span where unclipped, else a new one
        assert (theirs in spans) == (mine in spans)


def test_random_plans_many_of_which_the_gates_accept(accept: native_planner.Accept) -> None:
    """20,000 seeded cases drawn so that about a fifth are accepted: tiled spans from near 0 (some moved, some from
    approximate donors, gaps and overlaps now and then) over 1-8K-token prompts, every gate setting."""
    rng = random.Random(20261127)
    accepted = shifted = multi_shifted = clipped = exact_only = 0
    for _ in range(20_000):
        pos = rng.choice([0, 0, 0, 5, 32, 64])
        spans = []
        for _ in range(rng.randint(1, 6)):
            length = 32 * rng.randint(1, 60) if rng.random() < 0.6 else rng.randint(1, 2000)
            delta = rng.choice([0, 0, 0, 40, -40, 17, 300, -700, 2500, -5000])
            spans.append(Span(rng.choice("abc"), max(0, pos - delta), pos, length))
            pos = max(0, pos + length + rng.choice([0, 0, 0, 0, 0, 3, -2, 64]))
        rng.shuffle(spans)
        config = SemblendConfig(block_size=BS).model_copy(
            update={
                "exact_materialization_only": rng.random() < 0.4,
                "strict_prefix_boundary": rng.random() < 0.5,
                "discovery_only": rng.random() < 0.05,
                "min_span_tokens": rng.choice([1, 32, 64, 200]),
                "min_reuse_ratio": rng.choice([0.0, 0.05, 0.3]),
                "max_spans": rng.choice([1, 2, 8, 8]),
                "max_deviation": rng.choice([0.35, 0.6, 1.0]),
                "min_similarity": rng.choice([0.0, 0.5]),
                "isolation": rng.choice(["no_block_reuse", "cache_salt", "cache_salt", "none"]),
            }
        )
        kwargs: dict[str, Any] = {
            "similarity": rng.choice([None, None, rng.random()]),
            "device_prefix_tokens": BS * rng.choice([0, 0, 0, 1, 2, 20]),
            "approximate_donors": rng.choice([(), (), {"a"}, {"b", "c"}]),
            "chain_head_tokens": rng.choice([None, None, None, 0, 16, 64]),
        }
        target_len = max(sum(s.length for s in spans) + rng.choice([0, 1, 100, 3000]), rng.choice([1024, 8192]))
        expected = python_decision(config, target_len, spans, **kwargs)
        got = native_decision(accept, config, target_len, spans, **kwargs)
        if expected.reason is not None:
            exact_only += same_decline(got, expected)
            continue
        assert isinstance(got, PlanDecision) and summary(got) == summary(expected)
        assert expected.plan is not None
        accepted += 1
        shifted += expected.plan.mode == "shifted"
        moved = [s for s in expected.plan.spans if s.donor_start != s.target_start]
        multi_shifted += len(moved) > 1
        clipped += any(all(s is not t for t in spans) for s in expected.plan.spans)
    assert accepted > 3000 and shifted > 1000 and multi_shifted > 300 and clipped > 1000 and exact_only > 1000, (
        accepted,
        shifted,
        multi_shifted,
        clipped,
        exact_only,
    )


def test_the_connectors_usual_hits() -> None:
    """Exact and shifted single-span hits, and two shifted spans (their weighted deviations summed by sum())."""
    shifted = SemblendConfig(block_size=BS, exact_materialization_only=False, isolation="no_block_reuse")
    exact = SemblendConfig(block_size=BS)
    cases = [
        (shifted, [Span(donor_id="0:4", donor_start=40, target_start=0, length=6144)]),
        (exact, [Span(donor_id="0:4", donor_start=0, target_start=0, length=6144)]),
        (shifted, [Span("a", 100, 0, 768), Span("b", 900, 768, 2048), Span("c", 7, 2816, 333)]),
    ]
    for cfg, spans in cases:
        expected = python_decision(cfg, 8192, spans)
        got = Planner(cfg).plan(8192, spans)
        assert expected.accepted and summary(got) == summary(expected)


def test_the_routers_shifted_spans_are_declined_exact_only_by_the_compiled_path(accept: native_planner.Accept) -> None:
    """The router's span path with the default settings: spans moved from their donors' positions, no exact-equivalent
    one. The compiled path makes the Python planner's decline (no second pass through the Python gates)."""
    cfg = SemblendConfig(block_size=BS)
    spans = [Span("a", 0, 2048, 512), Span("b", 0, 2560, 512), Span("c", 64, 3072, 512)]
    expected = python_decision(cfg, 8192, spans)
    assert expected.reason is DeclineReason.EXACT_ONLY_MODE
    assert same_decline(native_decision(accept, cfg, 8192, spans), expected)


def test_inputs_it_does_not_take_as_they_are_go_to_the_python_planner(accept: native_planner.Accept) -> None:
    cfg = SemblendConfig(block_size=BS)
    span = Span(donor_id="a", donor_start=0, target_start=0, length=640)
    assert native_decision(accept, cfg, 1024, [span]) is not None
    assert native_decision(accept, cfg, np.int64(1024), [span]) is None  # not an exact int
    assert native_decision(accept, cfg, 1024, (span,)) is not None
    assert native_decision(accept, cfg, 1024, iter([span])) is None  # not a list or tuple
    assert native_decision(accept, cfg, 1024, [span], similarity=1) is None  # an int similarity
    assert native_decision(accept, cfg, 2**70, [span]) is None  # too large for the C path
    many = [Span("a", 32 * i, 32 * i, 32) for i in range(65)]
    assert native_decision(accept, cfg.model_copy(update={"min_span_tokens": 1}), 4096, many) is None
    assert native_decision(accept, cfg, 1024, [span], chain_head_tokens=1.5) is None
    loose = SemblendConfig(block_size=BS).model_copy(update={"min_reuse_ratio": 0})  # an int where a float is due
    assert native_decision(accept, loose, 1024, [span]) is None
    assert python_decision(loose, 1024, [span]).accepted


def test_a_module_built_from_other_source_is_refused(tmp_path: Path, accept: native_planner.Accept) -> None:
    other = tmp_path / "planner.c"
    other.write_text(native_planner.SOURCE.read_text() + "\n/* changed */\n")
    suffix = native_planner.module_path().name.removeprefix("_planner")
    out = tmp_path / f"_planner{suffix}"
    from semblend_dynamo._native.build import compile_library

    include = sysconfig.get_paths()["include"]
    compile_library(other, out, [f"-I{include}", '-DMODULE_SOURCE_DIGEST="0000000000000000"'])
    function, reason = native_planner.load(out, SETUP)
    assert function is None and "another planner.c" in reason
    assert native_planner.load(tmp_path / "missing.so", SETUP)[0] is None


def test_status_says_what_the_planner_decided_without_importing_it(capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m semblend_dynamo.native_planner status`` decides on its own (the module does not import its users)
    and agrees with the planner's own decision."""
    assert native_planner.main(["status"]) == 0
    used = "native" if planner.NATIVE_ACCEPT is not None else "python"
    assert capsys.readouterr().out == f"{used}: {planner.NATIVE_REASON}\n"


def test_status_says_why_a_module_is_not_used(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(native_planner.ENV, "0")
    assert native_planner.MODULE.status() == f"python: {native_planner.ENV}=0"
    monkeypatch.delenv(native_planner.ENV)
    elsewhere = dataclasses.replace(native_planner.MODULE, source=tmp_path / "planner.c")
    assert elsewhere.status() == f"python: {elsewhere.module_path().name} is not built ({elsewhere.command} build)"
