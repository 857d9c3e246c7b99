"""CPU smoke test of the engine-in-the-loop reference engine: a tiny random Llama, the real connector and kernels.

The reference engine (semblend_apps/reference_engine/hf_engine.py) drives SemBlend's scheduler and worker through the
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
from semblend_apps.reference_engine import kv_pool  # noqa: E402
from semblend_apps.reference_engine.hf_engine import HFReferenceEngine, cold_prefill  # noqa: E402
from semblend_apps.reference_engine.hf_model import KVGeometry, cache_layers, prefill  # noqa: E402
from semblend_apps.reference_engine.kv_pool import read_prefix, write_range  # noqa: E402
from semblend_apps.reference_engine.prefill_runner import PrefillRunner  # noqa: E402
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


def test_pool_round_trip_is_lossless(monkeypatch) -> None:
    layout = PagedKVLayout(num_layers=2, num_kv_heads=2, head_dim=8, tokens_per_block=4)
    pool = torch.zeros(10, 2, 2, layout.block_elems, dtype=torch.bfloat16)
    kv = torch.randn(2, 2, 2, 10, 8).bfloat16()  # [layers, K|V, heads, tokens, dim]
    blocks = [7, 2, 5]
    write_range(pool, layout, blocks, kv[:, :, :, :4], start_token=0)
    write_range(pool, layout, blocks, kv[:, :, :, 4:], start_token=4)
    out = torch.full((2, 2, 2, 12, 8), float("nan"), dtype=torch.bfloat16)
    assert torch.equal(read_prefix(pool, layout, blocks, 10, out), kv)
    # consecutive block ids are copied run by run; a fragmented list is gathered: the same result either way
    runs = [3, 4, 5]
    write_range(pool, layout, runs, kv, start_token=0)
    assert torch.equal(read_prefix(pool, layout, runs, 10, out.clone()), kv)
    scattered = [9, 0, 8]
    write_range(pool, layout, scattered, kv, start_token=0)
    with monkeypatch.context() as m:
        m.setattr(kv_pool, "MAX_RUN_COPIES", 1)
        assert torch.equal(read_prefix(pool, layout, scattered, 10, out.clone()), kv)
        assert torch.equal(read_prefix(pool, layout, runs, 10, out.clone()), kv)
    with pytest.raises(ValueError, match="multiple"):
        write_range(pool, layout, blocks, kv, start_token=3)
    with pytest.raises(ValueError, match="do not fit"):
        read_prefix(pool, layout, blocks, 10, out[:, :, :, :11])


def test_arena_prefill_matches_the_dynamic_cache_prefill(tiny_model) -> None:
    """The arena (in-place K/V, views for attention) computes what transformers' own DynamicCache path computes."""
    tokens = _tokens(9, 96)
    runner = PrefillRunner(tiny_model)
    runner.prefill(tokens[:64], 0)
    split = runner.prefill(tokens, 64, keep=4)
    _, past = prefill(tiny_model, torch.tensor(tokens[:64]), None, 1)
    reference, reference_cache = prefill(tiny_model, torch.tensor(tokens[64:]), past, 4)
    assert torch.allclose(split, reference, atol=1e-2, rtol=0)
    for (k, v), (rk, rv) in zip(cache_layers(runner.arena.cache(96)), cache_layers(reference_cache), strict=True):
        assert k.shape == rk.shape == (1, 2, 96, 16)
        assert torch.allclose(k, rk, atol=1e-2, rtol=0) and torch.allclose(v, rv, atol=1e-2, rtol=0)
    with pytest.raises(ValueError, match="CUDA"):
        PrefillRunner(tiny_model, cuda_graphs=True)


def test_exact_prefix_is_materialized_and_reproduces_the_cold_split(tiny_model) -> None:
    shared, donor_tail, target_tail = _tokens(1, 160), _tokens(2, 64), _tokens(3, 64)
    engine = HFReferenceEngine(tiny_model, _config("exact"), num_blocks=64)
    engine.run(shared + donor_tail)
    target = shared + target_tail
    warm = engine.run(target)
    assert warm.materialized == 160 and warm.declined == {}
    assert engine.audit.by_event["materialized"] == 1

    split_runner = PrefillRunner(tiny_model)
    split_runner.prefill(shared, 0)
    split = split_runner.prefill(target, len(shared))
    cold, _, _ = cold_prefill(tiny_model, target)
    assert torch.equal(warm.logits, split)  # the pool round trip and the block copy lose nothing
    assert float((warm.logits - cold).abs().max()) <= float((split - cold).abs().max()) + 1e-6


def test_a_baseline_on_the_engine_runner_leaves_the_engine_usable(tiny_model) -> None:
    """The cold baseline may grow the engine's arena; the engine's readback then writes into the new one."""
    engine = HFReferenceEngine(tiny_model, _config("exact"), num_blocks=64)
    shared = _tokens(10, 192)
    engine.run(shared + _tokens(11, 32))
    cold, _, _ = cold_prefill(tiny_model, shared + _tokens(12, 320), runner=engine.runner)
    warm = engine.run(shared + _tokens(12, 320))
    assert warm.materialized == 192 and engine.runner.arena.capacity >= 512
    assert float((warm.logits - cold).abs().max()) < 0.1


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
    shape = (geometry.num_layers, 2, geometry.kv_heads, 224, geometry.head_dim)
    donor_kv = read_prefix(pool, layout, donor.block_ids, 200, pool.new_empty(shape))
    target_kv = read_prefix(pool, layout, warm.block_ids, 160, pool.new_empty(shape))
    rope = RopeConfig.from_hf_config(tiny_model.config)
    delta = torch.full((160,), -40, dtype=torch.int64)
    for (dk, dv), (tk, tv) in zip(donor_kv, target_kv, strict=True):
        assert torch.equal(tv, dv[:, 40:])  # V is position-free: copied bit for bit
        src = dk[:, 40:].transpose(0, 1).float()  # [T, H, D]
        expected = rotate_reference(src, delta, rope.inv_freq(), rope.rotary_dim, rope.style)
        err = (tk.transpose(0, 1).float() - expected).abs().max()
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
            "tiny",
            "--share-sweep",
            "0.5",
            "--share-sweep-tokens",
            "256",
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
    assert all(r["materialized"] > 0 and r["graph_captures_timed"] == 0 for r in results["ttft"])
    speed = [(r["mode"], r["share"]) for r in results["ttft"] if r["model"] == "tiny (eager)"]
    assert speed == [("exact", 0.875), ("shifted", 0.875), ("exact", 0.5)]  # 95% and 50% of 256, block aligned
    assert (results_dir / "results.md").read_text().count("| exact_prefix |") == 2


@pytest.mark.parametrize("shift", [0, 100])
def test_every_timed_target_loads_from_its_donor_at_the_configured_delta(tiny_model, shift: int) -> None:
    # Finished targets become donors too: a later target must not find the shared span in an earlier one at delta 0
    # (shifted mode would then time an unrotated copy).
    (row,) = run_engine_bench.run_ttft(
        tiny_model,
        label="tiny",
        lengths=[512],
        share=0.9,
        shift=shift,
        repeats=2,
        block_size=BLOCK,
        vocab_size=TINY_LLAMA["vocab_size"],
        cuda_graphs=False,
    )
    assert row["loaded_deltas"] == [-shift] * 4  # 2 targets with the stage clock, 2 without
    assert row["materialized"] >= 0.8 * 512
