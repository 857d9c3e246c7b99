"""Embedders: the self-built MiniLM ONNX graph against an independent oracle (transformers' BertModel on torch),
the hash fallback, build_embedder and bad input."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from semblend_dynamo.config import SemblendConfig
from semblend_dynamo.embedder import Embedder, EmbeddingError, HashEmbedder, build_embedder, embed_token_windows
from semblend_dynamo.embedder import factory as embedder_factory
from semblend_dynamo.embedder.base import normalized_rows
from semblend_dynamo.embedder.minilm import MiniLMEmbedder, bundled_model_dir
from semblend_dynamo.embedder.onnx_graph import build_cached_graph
from semblend_dynamo.segmenter import WindowSegmenter
from semblend_dynamo.tokenizer import TokenizerAdapter, bundled_tokenizer_path

TEXTS = [
    "How do I reset my password?",
    "What is the procedure to change a forgotten password?",
    "The logging module passes LogRecord instances to handlers, which format and emit them.",
    "Pandas are black and white bears that live in the bamboo forests of China.",
    "naïve café — 東京 🚀",
]


@pytest.fixture(scope="session")
def onnx_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("onnx-cache")


@pytest.fixture(scope="session")
def minilm(onnx_cache: Path) -> MiniLMEmbedder:
    return MiniLMEmbedder(cache_dir=onnx_cache)


def oracle_embeddings(texts: list[str]) -> np.ndarray:
    """transformers' BertModel (torch, CPU) from the same weights, mean pooling + L2 norm: independent of ONNX."""
    torch = pytest.importorskip("torch")
    from tokenizers import Tokenizer
    from transformers import BertModel

    model_dir = bundled_model_dir()
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok.enable_truncation(max_length=256)
    tok.enable_padding(pad_id=0, pad_token="[PAD]")
    enc = tok.encode_batch(texts)
    ids = torch.tensor([e.ids for e in enc])
    mask = torch.tensor([e.attention_mask for e in enc])
    bert = BertModel.from_pretrained(str(model_dir)).eval()
    with torch.no_grad():
        hidden = bert(input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids)).last_hidden_state
    m = mask.unsqueeze(-1).float()
    pooled = (hidden * m).sum(1) / m.sum(1)
    return torch.nn.functional.normalize(pooled, dim=1).numpy()


def test_minilm_matches_transformers_oracle(minilm: MiniLMEmbedder) -> None:
    corpus_doc = (bundled_tokenizer_path().parent / "corpus" / "logging.txt").read_text()
    texts = [*TEXTS, corpus_doc[:5000]]  # the last one is truncated to 256 tokens by both
    ours = minilm.embed(texts)
    ref = oracle_embeddings(texts)
    assert ours.shape == (len(texts), 384) and ours.dtype == np.float32
    cosine = (ours * ref).sum(axis=1)
    assert cosine.min() >= 0.9999, cosine


def test_minilm_graph_is_built_once_and_cached(minilm: MiniLMEmbedder, onnx_cache: Path) -> None:
    path = minilm.graph_path
    assert path.parent == onnx_cache and minilm.weights_sha256[:16] in path.name
    before = path.stat().st_mtime_ns
    assert build_cached_graph(bundled_model_dir(), onnx_cache) == path
    assert path.stat().st_mtime_ns == before


def test_minilm_batching_and_padding_do_not_change_vectors(minilm: MiniLMEmbedder) -> None:
    together = minilm.embed(TEXTS)
    alone = np.concatenate([minilm.embed([t]) for t in TEXTS])
    assert np.allclose(together, alone, atol=1e-5)
    assert np.allclose(np.linalg.norm(together, axis=1), 1.0, atol=1e-5)


def test_minilm_ranks_paraphrase_above_unrelated(minilm: MiniLMEmbedder) -> None:
    v = minilm.embed(TEXTS[:4])
    assert v[0] @ v[1] > 0.6 > v[0] @ v[3]
    assert isinstance(minilm, Embedder) and minilm.name.startswith("all-MiniLM-L6-v2-fp32-")


def test_minilm_int8_stays_close_to_fp32(minilm: MiniLMEmbedder, onnx_cache: Path) -> None:
    int8 = MiniLMEmbedder(cache_dir=onnx_cache, precision="int8")
    assert int8.name != minilm.name  # never mixed in one index
    cosine = (int8.embed(TEXTS) * minilm.embed(TEXTS)).sum(axis=1)
    assert cosine.min() > 0.95, cosine


def test_cuda_request_without_cuda_provider_falls_back_to_cpu(
    onnx_cache: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has a CUDA provider; covered by the gpu test")
    with caplog.at_level(logging.WARNING):
        emb = MiniLMEmbedder(cache_dir=onnx_cache, provider="cuda")
    assert emb.provider == "CPUExecutionProvider"
    assert "embedding on CPU" in caplog.text
    assert emb.embed(["still works"]).shape == (1, 384)


@pytest.mark.gpu
def test_cuda_provider_runs_on_gpu(onnx_cache: Path, request: pytest.FixtureRequest) -> None:
    ort = pytest.importorskip("onnxruntime")
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("needs onnxruntime-gpu with CUDA (the onnx-gpu extra)")
    minilm: MiniLMEmbedder = request.getfixturevalue("minilm")  # only where the test runs: it needs the model package
    emb = MiniLMEmbedder(cache_dir=onnx_cache, provider="cuda")
    assert emb.provider == "CUDAExecutionProvider"
    assert ((emb.embed(TEXTS) * minilm.embed(TEXTS)).sum(axis=1) > 0.999).all()


@pytest.mark.parametrize("bad", [[""], ["ok", "   "], "a bare string", [None]])
def test_empty_or_non_text_input_raises(minilm: MiniLMEmbedder, bad: object) -> None:
    for embedder in (minilm, HashEmbedder()):
        with pytest.raises(EmbeddingError):
            embedder.embed(bad)  # type: ignore[arg-type]


def test_no_texts_gives_empty_matrix(minilm: MiniLMEmbedder) -> None:
    assert minilm.embed([]).shape == (0, 384)
    assert HashEmbedder().embed([]).shape == (0, 384)


class NaNSessionStub:
    """Stands in for an onnxruntime session whose model produced NaN (e.g. corrupt weights)."""

    def run(self, _outputs: object, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        out = np.ones((len(feed["input_ids"]), 384), dtype=np.float32)
        out[0, 5] = np.nan
        return [out]


def test_nan_model_output_raises_embedding_error(onnx_cache: Path) -> None:
    emb = MiniLMEmbedder(cache_dir=onnx_cache)
    emb._session = NaNSessionStub()  # type: ignore[assignment]
    with pytest.raises(EmbeddingError, match="NaN or inf"):
        emb.embed(["anything"])


@pytest.mark.parametrize(
    ("vectors", "message"),
    [
        (np.array([[1.0, np.inf, 0.0, 0.0]]), "NaN or inf"),
        (np.zeros((1, 4)), "zero norm"),
        (np.ones((2, 3)), "shape"),
    ],
)
def test_normalized_rows_rejects_invalid_vectors(vectors: np.ndarray, message: str) -> None:
    with pytest.raises(EmbeddingError, match=message):
        normalized_rows(vectors, 4)


def test_hash_embedder_is_deterministic_normalized_and_lexical() -> None:
    emb = HashEmbedder()
    a = emb.embed(TEXTS)
    assert np.array_equal(a, HashEmbedder().embed(TEXTS))
    assert np.allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-6)
    v = emb.embed(["reset my password please", "please reset my password", "bears eat bamboo in china"])
    assert v[0] @ v[1] > 0.6 > v[0] @ v[2]
    assert HashEmbedder(seed=1).name != emb.name
    assert emb.embed(["!!!"]).shape == (1, 384)  # punctuation-only text still has features


def test_build_embedder_follows_config(onnx_cache: Path) -> None:
    assert isinstance(build_embedder(SemblendConfig(embedder="hash")), HashEmbedder)
    emb = build_embedder(SemblendConfig(embedder="minilm", onnx_cache_dir=str(onnx_cache)))
    assert isinstance(emb, MiniLMEmbedder) and emb.graph_path.parent == onnx_cache


def test_missing_extra_falls_back_to_hash_and_logs_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime -> ImportError
    monkeypatch.setattr(embedder_factory, "_fallback_logged", type(embedder_factory._fallback_logged)())
    with caplog.at_level(logging.WARNING):
        first = build_embedder(SemblendConfig(embedder="minilm"))
        second = build_embedder(SemblendConfig(embedder="minilm"))
    assert isinstance(first, HashEmbedder) and isinstance(second, HashEmbedder)
    warnings = [r for r in caplog.records if "embedder extra is not installed" in r.getMessage()]
    assert len(warnings) == 1


def test_embed_token_windows_covers_a_long_prompt(minilm: MiniLMEmbedder) -> None:
    tok = TokenizerAdapter.bundled()
    text = (bundled_tokenizer_path().parent / "corpus" / "threading.txt").read_text()
    ids = tok.encode(text)[:1200]
    windows = WindowSegmenter(256, 32).windows(len(ids))
    vectors = embed_token_windows(minilm, tok, ids, windows)
    assert vectors.shape == (len(windows), 384)
    first = minilm.embed([tok.decode(ids[:256])])[0]
    assert float(vectors[0] @ first) > 0.9999
    with pytest.raises(EmbeddingError, match="outside a prompt"):
        embed_token_windows(minilm, tok, ids[:100], windows)
    assert embed_token_windows(minilm, tok, [], []).shape == (0, 384)


NO_TORCH_EMBED = """
import importlib.abc, json, sys
from pathlib import Path

class BlockTorch(importlib.abc.MetaPathFinder):  # the embedder extra installs no torch: make it unimportable
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("torch", "transformers", "sentence_transformers"):
            raise ImportError(f"{name} is not installed")

sys.meta_path.insert(0, BlockTorch())
from semblend_dynamo.embedder.minilm import MiniLMEmbedder

emb = MiniLMEmbedder(cache_dir=Path(sys.argv[1]))
print(json.dumps({"graph": emb.graph_path.name, "vectors": emb.embed(json.loads(sys.argv[2])).tolist(),
                  "torch": any(m.split(".")[0] == "torch" for m in sys.modules)}))
"""


def test_minilm_builds_its_fused_graph_and_embeds_without_torch(minilm: MiniLMEmbedder, tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", NO_TORCH_EMBED, str(tmp_path), json.dumps(TEXTS)],
        capture_output=True, text=True, timeout=240, check=True,
    )  # fmt: skip
    out = json.loads(proc.stdout)
    assert out["torch"] is False and out["graph"].endswith("-ortopt.onnx"), (out["graph"], proc.stderr)
    np.testing.assert_allclose(np.asarray(out["vectors"], dtype=np.float32), minilm.embed(TEXTS), atol=1e-5)
