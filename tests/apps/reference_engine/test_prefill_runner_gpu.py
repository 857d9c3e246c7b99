"""CUDA-graph prefill of the reference engine on a real GPU: replay computes what the eager forward computes."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from benchmarks.engine_in_loop import run_engine_bench  # noqa: E402
from semblend_apps.reference_engine.hf_engine import HFReferenceEngine, cold_prefill  # noqa: E402
from semblend_apps.reference_engine.hf_model import LOWER_RIGHT_SDPA, random_llama  # noqa: E402
from semblend_apps.reference_engine.prefill_runner import PrefillRunner  # noqa: E402

from .test_engine_smoke import TINY_LLAMA, _tokens  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture(scope="module")
def cuda_model():
    torch.manual_seed(0)
    return random_llama(TINY_LLAMA, "cuda", attn=LOWER_RIGHT_SDPA)


def test_graph_replay_equals_the_eager_forward(cuda_model) -> None:
    eager, graphs = PrefillRunner(cuda_model, capacity=200), PrefillRunner(cuda_model, cuda_graphs=True, capacity=200)
    for seed in (1, 2, 3):  # the first call captures, the others replay with new ids and a new prefix
        tokens = _tokens(seed, 200)
        for runner in (eager, graphs):
            runner.prefill(tokens[:128], 0)
        expected = eager.prefill(tokens, 128, keep=3)
        got = graphs.prefill(tokens, 128, keep=3)
        assert torch.equal(got, expected)
        assert torch.equal(graphs.arena.kv[:, :, :, :200], eager.arena.kv[:, :, :, :200])
    assert graphs.captures == 2  # (0, 128) and (128, 72)
    graphs.reserve(4096)  # growing the arena drops the graphs that point into the old one
    graphs.prefill(_tokens(4, 128), 0)
    assert graphs.captures == 3


def test_engine_with_graphs_materializes_like_the_eager_engine(cuda_model) -> None:
    shared, donor_tail, target_tail = _tokens(5, 320), _tokens(6, 64), _tokens(7, 64)
    logits = []
    for cuda_graphs in (False, True):
        engine = HFReferenceEngine(
            cuda_model, run_engine_bench.engine_config("exact", 32), num_blocks=64, cuda_graphs=cuda_graphs
        )
        engine.run(shared + donor_tail)
        warm = engine.run(shared + target_tail)
        assert warm.materialized == 320
        logits.append(warm.logits)
        cold, _, _ = cold_prefill(cuda_model, shared + target_tail, runner=engine.runner)
        assert float((warm.logits - cold).abs().max()) < 0.25  # bf16 split-vs-whole noise of this tiny model
    assert torch.equal(logits[0], logits[1])
