"""The compiled core's search thread (``sa_job_*``): :meth:`SpanAligner.begin_align` gives what :meth:`align` gives,
one search at a time (a second begun meanwhile is done at once), in a forked child too, and discovery's lock is held
from :meth:`DonorDiscovery.begin_spans` to :meth:`DonorDiscovery.end_spans`, whatever happens."""

from __future__ import annotations

import os

import numpy as np
import pytest

from semblend_dynamo import _native
from semblend_dynamo.config import SemblendConfig
from semblend_dynamo.embedder import HashEmbedder
from semblend_dynamo.namespace import NamespaceKey
from semblend_dynamo.pipeline import DonorDiscovery
from semblend_dynamo.span_aligner import SpanAligner

native = pytest.mark.skipif(_native.LIBRARY is None, reason=f"native core not loaded: {_native.REASON}")


def _aligner(native_core: bool = True) -> tuple[SpanAligner, np.ndarray]:
    aligner = SpanAligner(block_size=4, min_span_tokens=8, anchor_tokens=6, native=native_core)
    text = np.random.default_rng(1).integers(0, 30_000, 4_000)
    for k in range(8):
        aligner.add_donor(f"d{k}", "ns", text[500 * k : 500 * k + 500])
    return aligner, text


def _targets(text: np.ndarray, count: int) -> list[np.ndarray]:
    rng = np.random.default_rng(2)
    out = []
    for _ in range(count):
        pieces = [rng.integers(40_000, 50_000, int(rng.integers(0, 40)))]
        for start in rng.integers(0, 3_900, int(rng.integers(0, 4))):
            pieces += [text[start : start + int(rng.integers(6, 100))], rng.integers(40_000, 50_000, 7)]
        out.append(np.concatenate(pieces).astype(np.int64))
    return out


@native
def test_a_search_on_the_thread_finds_what_align_finds() -> None:
    aligner, text = _aligner()
    found = 0
    for target in _targets(text, 300):
        expected = aligner.align("ns", target)
        search = aligner.begin_align("ns", target)
        assert search._aligner is aligner or target.size < 8  # on the thread, unless too short to search
        aligner.wake_search_thread()  # harmless while a search runs
        assert search.result() == expected
        found += bool(expected)
    assert found > 100


@native
def test_a_second_search_begun_while_one_runs_is_done_at_once() -> None:
    first, text = _aligner()
    second, _ = _aligner()
    target = _targets(text, 5)[-1]
    expected = first.align("ns", target)
    running = first.begin_align("ns", target)
    assert running._aligner is first
    at_once = second.begin_align("ns", target)
    assert at_once._aligner is None  # the thread is busy: found on the caller's thread
    assert at_once.result() == expected and running.result() == expected
    again = second.begin_align("ns", target)
    assert again._aligner is second and again.result() == expected  # free again


@native
def test_a_search_dropped_without_its_result_does_not_hold_the_thread() -> None:
    aligner, text = _aligner()
    target = _targets(text, 5)[-1]
    assert aligner.begin_align("ns", target)._aligner is aligner  # dropped at once: its result is taken on the way
    search = aligner.begin_align("ns", target)
    assert search._aligner is aligner and search.result() == aligner.align("ns", target)


def test_without_the_compiled_core_a_search_is_done_when_begun() -> None:
    aligner, text = _aligner(native_core=False)
    for target in _targets(text, 20):
        search = aligner.begin_align("ns", target)
        assert search._aligner is None and search.result() == aligner.align("ns", target)


def test_a_result_is_taken_once() -> None:
    aligner, text = _aligner()
    search = aligner.begin_align("ns", _targets(text, 1)[0])
    search.result()
    with pytest.raises(AssertionError):
        search.result()


@native
@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_a_forked_child_starts_its_own_search_thread() -> None:
    aligner, text = _aligner()
    targets = _targets(text, 20)
    expected = [aligner.align("ns", t) for t in targets]
    aligner.begin_align("ns", targets[0]).result()  # this process's thread is running
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child's exit status is the check)
        ok = all(aligner.begin_align("ns", t).result() == e for t, e in zip(targets, expected, strict=True))
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_discovery_holds_its_lock_from_begin_to_end_even_when_the_result_fails() -> None:
    cfg = SemblendConfig(block_size=4, min_span_tokens=8, embedder="hash")
    discovery = DonorDiscovery.from_config(cfg, embedder=HashEmbedder(), background=False)
    ns = NamespaceKey(model_id="m", tokens_per_block=4)
    text = np.random.default_rng(3).integers(0, 30_000, 200)
    discovery.aligner.add_donor("d", ns.digest(), text)
    search = discovery.begin_spans(ns, np.concatenate([np.arange(40_000, 40_040), text[:80]]))
    assert search is not None and discovery._lock._is_owned()  # type: ignore[attr-defined]

    def broken() -> list:
        raise RuntimeError("result failed")

    if search._aligner is None:
        search.result = broken  # type: ignore[method-assign]
    else:
        search._aligner._spans_of = lambda rows: broken()  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="result failed"):
        discovery.end_spans(search)
    assert not discovery._lock._is_owned()  # type: ignore[attr-defined]
    assert discovery.begin_spans(ns, [1, 2]) is not None  # too short to search: found at once (nothing)
    discovery._lock.release()
