"""CPU smoke test of the engine-in-the-loop reference engine: a tiny random Llama, the real connector and kernels.

The reference engine (benchmarks/engine_in_loop/hf_engine.py) drives SemBlend's scheduler and worker through the
PyExecutor harness over a bf16 paged pool in TensorRT-LLM's layout; these tests check what it materializes, that
exact reuse reproduces a cold computation of the same split, that shifted K is the donor's K rotated by the delta,
and that the benchmark runner works end to end on a saved model directory.
"""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from semblend_kernels.layout import PagedKVLayout  # noqa: E402
from semblend_kernels.rope import RopeConfig  # noqa: E402
from semblend_kernels.rope_delta import rotate_reference  # noqa: E402

from benchmarks.engine_in_loop import run_engine_bench  # noqa: E402
from benchmarks.engine_in_loop.hf_engine import HFReferenceEngine, cold_prefill  # noqa: E402
from benchmarks.engine_in_loop.hf_model import KVGeometry, prefill  # noqa: E402
from benchmarks.engine_in_loop.kv_pool import read_prefix, write_range  # noqa: E402
from semblend_dynamo.config import SemblendConfig  # noqa: E402

BLOCK = 32
TINY_LLAMA = {
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 2048,
    "rope_theta": 10000.0,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 4.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 256,
    },
}


@pytest.fixture(scope="module")
def tiny_model():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(attn_implementation="sdpa", **TINY_LLAMA)
    return transformers.LlamaForCausalLM(config).to(torch.bfloat16).eval()


def _tokens(seed: int, n: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, TINY_LLAMA["vocab_size"], (n,), generator=gen).tolist()


def _config(mode: str) -> SemblendConfig:
    return run_engine_bench.engine_config(mode, BLOCK)


def test_pool_round_trip_is_lossless() -> None:
    layout = PagedKVLayout(num_layers=2, num_kv_heads=2, head_dim=8, tokens_per_block=4)
    pool = torch.zeros(10, 2, 2, layout.block_elems, dtype=torch.bfloat16)
    layers = [(torch.randn(1, 2, 10, 8).bfloat16(), torch.randn(1, 2, 10, 8).bfloat16()) for _ in range(2)]
    blocks = [7, 2, 5]
    write_range(pool, layout, blocks, [(k[:, :, :4], v[:, :, :4]) for k, v in layers], start_token=0)
    write_range(pool, layout, blocks, [(k[:, :, 4:], v[:, :, 4:]) for k, v in layers], start_token=4)
    back = read_prefix(pool, layout, blocks, 10)
    for (k, v), (k2, v2) in zip(layers, back, strict=True):
        assert torch.equal(k, k2) and torch.equal(v, v2)
    with pytest.raises(ValueError, match="multiple"):
        write_range(pool, layout, blocks, layers, start_token=3)


def test_exact_prefix_is_materialized_and_reproduces_the_cold_split(tiny_model) -> None:
    shared, donor_tail, target_tail = _tokens(1, 160), _tokens(2, 64), _tokens(3, 64)
    engine = HFReferenceEngine(tiny_model, _config("exact"), num_blocks=64)
    engine.run(shared + donor_tail)
    target = shared + target_tail
    warm = engine.run(target)
    assert warm.materialized == 160 and warm.declined == {}
    assert engine.audit.by_event["materialized"] == 1

    _, past = prefill(tiny_model, torch.tensor(shared), None, 1)
    split, _ = prefill(tiny_model, torch.tensor(target_tail), past, 1)
    cold, _, _ = cold_prefill(tiny_model, target)
    assert torch.equal(warm.logits, split)  # the pool round trip and the block copy lose nothing
    assert float((warm.logits - cold).abs().max()) <= float((split - cold).abs().max()) + 1e-6


def test_unrelated_donor_materializes_nothing(tiny_model) -> None:
    engine = HFReferenceEngine(tiny_model, _config("shifted"), num_blocks=64)
    engine.run(_tokens(4, 200))
    warm = engine.run(_tokens(5, 200))
    assert warm.materialized == 0
    assert warm.declined == {"no_candidate": 1}


def test_shifted_span_is_the_donor_kv_rotated_by_the_delta(tiny_model) -> None:
    filler, shared, tail = _tokens(6, 40), _tokens(7, 160), _tokens(8, 64)
    engine = HFReferenceEngine(tiny_model, _config("shifted"), num_blocks=64)
    donor = engine.run(filler + shared)
    warm = engine.run(shared + tail)
    assert warm.materialized == 160 and warm.device_matched == 0

    geometry = KVGeometry.of(tiny_model.config)
    layout = PagedKVLayout(geometry.num_layers, geometry.kv_heads, geometry.head_dim, BLOCK)
    pool = engine.harness.pool
    donor_kv = read_prefix(pool, layout, donor.block_ids, 200)
    target_kv = read_prefix(pool, layout, warm.block_ids, 160)
    rope = RopeConfig.from_hf_config(tiny_model.config)
    delta = torch.full((160,), -40, dtype=torch.int64)
    for (dk, dv), (tk, tv) in zip(donor_kv, target_kv, strict=True):
        assert torch.equal(tv, dv[:, :, 40:])  # V is position-free: copied bit for bit
        src = dk[0, :, 40:].transpose(0, 1).float()  # [T, H, D]
        expected = rotate_reference(src, delta, rope.inv_freq(), rope.rotary_dim, rope.style)
        err = (tk[0].transpose(0, 1).float() - expected).abs().max()
        assert float(err) <= 2 * float(src.abs().max()) * 2**-8  # within bf16 rounding of the rotated value


def _save_tiny_model_dir(model, path: Path) -> Path:
    from benchmarks.engine_in_loop.train_small_llama import train_tokenizer

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = [(stdlib / name).read_text() for name in ("argparse.py", "textwrap.py", "difflib.py")]
    tokenizer = train_tokenizer(texts, vocab_size=TINY_LLAMA["vocab_size"])
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_benchmark_runner_end_to_end(tiny_model, tmp_path: Path) -> None:
    model_dir = _save_tiny_model_dir(tiny_model, tmp_path / "model")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    docs = [stdlib / name for name in ("typing.py", "inspect.py", "tarfile.py", "pathlib/__init__.py", "pydoc.py")]
    heldout = tmp_path / "heldout.jsonl"
    heldout.write_text("".join(json.dumps({"text": p.read_text()}) + "\n" for p in docs if p.is_file()))
    results_dir = tmp_path / "results"
    rc = run_engine_bench.main(
        [
            "--model-dir",
            str(model_dir),
            "--heldout-jsonl",
            str(heldout),
            "--results-dir",
            str(results_dir),
            "--prompt-tokens",
            "192",
            "--continuation-tokens",
            "16",
            "--greedy-tokens",
            "4",
            "--shares",
            "0.9",
            "--deltas",
            "40",
            "--ttft-lengths",
            "256",
            "--repeats",
            "1",
            "--speed-shape",
            "none",
        ]
    )
    results = json.loads((results_dir / "results.json").read_text())
    assert rc == 0 and results["errors"] == []
    rows = {(r["case"], r["mode"]): r for r in results["fidelity"]}
    exact = rows[("exact_prefix", "exact")]
    assert exact["materialized"] > 0 and exact["top1_agreement"] == 1.0
    assert exact["max_abs_logit_diff"] <= exact["noise_floor_max_abs_logit_diff"] + 1e-6
    # exact mode never materializes a shifted donor: the connector's exact-mode lookup indexes only shared
    # prefixes (no_candidate); a router hint for it would be refused as exact_only_mode
    shifted_in_exact = rows[("shifted_d40_s90", "exact")]
    assert shifted_in_exact["materialized"] == 0
    assert shifted_in_exact["declined"] in ({"no_candidate": 1}, {"exact_only_mode": 1})
    assert rows[("shifted_d40_s90", "shifted")]["materialized"] > 0
    assert all(r["materialized"] == 0 for r in results["fidelity"] if r["kind"] == "negative")
    assert {r["mode"] for r in results["ttft"]} == {"exact", "shifted"}
    assert all(r["materialized"] > 0 for r in results["ttft"])
    assert (results_dir / "results.md").read_text().count("| exact_prefix |") == 2
