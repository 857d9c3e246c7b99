"""Train a small Llama-architecture model offline, in one process, and report its held-out perplexity.

The corpus is whatever text the running Python installation carries (stdlib and site-packages ``.py``,
``.md``, ``.rst`` and ``.txt`` files), so the script needs no network. Documents are split into train and
held-out sets by a hash of their path; the held-out documents are saved next to the model so the
engine-in-the-loop workloads (``workloads.py``) are built from text the model never trained on.

Outputs under ``--out-dir``: ``model/`` (``LlamaForCausalLM.save_pretrained`` + the tokenizer, loadable with
``AutoModelForCausalLM.from_pretrained``), ``heldout.jsonl`` (one ``{"path", "text"}`` per line) and
``train_metrics.json``.

    python benchmarks/engine_in_loop/train_small_llama.py --out-dir /tmp/semblend-llama --train-seconds 200
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict

TEXT_SUFFIXES = (".py", ".md", ".rst", ".txt")


class ModelShape(BaseModel):
    """The Llama hyper-parameters this script trains (and the CPU smoke test shrinks)."""

    model_config = ConfigDict(extra="forbid")

    hidden_size: int = 512
    num_hidden_layers: int = 8
    num_attention_heads: int = 8
    num_key_value_heads: int = 4
    head_dim: int = 64
    intermediate_size: int = 1536
    max_position_embeddings: int = 32768
    rope_theta: float = 500_000.0
    # llama3-style rope scaling; factor <= 1 disables it.
    rope_scaling_factor: float = 8.0
    rope_original_max_positions: int = 2048


@dataclass
class Document:
    """One corpus file."""

    path: str
    text: str


def collect_corpus(max_bytes: int, heldout_percent: int) -> tuple[list[Document], list[Document]]:
    """Read text files of this Python installation; return (train, held-out) documents.

    The split is by BLAKE2b of the path so it is stable across machines with the same files.
    """
    roots = []
    for key in ("stdlib", "purelib", "platlib"):
        root = sysconfig.get_paths().get(key)
        if root and Path(root).is_dir() and root not in roots:
            roots.append(root)
    train: list[Document] = []
    heldout: list[Document] = []
    total = 0
    for root in roots:
        for path in sorted(Path(root).rglob("*")):
            if total >= max_bytes:
                break
            if path.suffix not in TEXT_SUFFIXES or not path.is_file():
                continue
            try:
                size = path.stat().st_size
                if size < 2_000 or size > 1_000_000:
                    continue
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            total += len(text)
            bucket = int.from_bytes(hashlib.blake2b(str(path).encode(), digest_size=4).digest(), "little") % 100
            (heldout if bucket < heldout_percent else train).append(Document(str(path), text))
    return train, heldout


def train_tokenizer(texts: list[str], vocab_size: int):  # -> PreTrainedTokenizerFast
    """A Qwen2-style byte-level BPE trained with ``tokenizers`` and wrapped for ``transformers``."""
    from transformers import PreTrainedTokenizerFast

    from semblend_dynamo.tokenizer import train_byte_level_bpe

    tok = train_byte_level_bpe(texts, vocab_size)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")


def llama_config(shape: ModelShape, vocab_size: int):  # -> LlamaConfig
    """A ``LlamaConfig`` for ``shape`` (llama3 rope scaling when ``rope_scaling_factor > 1``)."""
    from transformers import LlamaConfig

    rope: dict[str, object] = {"rope_type": "default", "rope_theta": shape.rope_theta}
    if shape.rope_scaling_factor > 1.0:
        rope = {
            "rope_type": "llama3",
            "rope_theta": shape.rope_theta,
            "factor": shape.rope_scaling_factor,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": shape.rope_original_max_positions,
        }
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        head_dim=shape.head_dim,
        max_position_embeddings=shape.max_position_embeddings,
        rope_theta=shape.rope_theta,
        rope_scaling=rope,
        rope_parameters=rope,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )


def token_stream(tokenizer, docs: list[Document]) -> torch.Tensor:
    """All documents encoded and joined with the end-of-text token, as one int64 tensor."""
    eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    ids: list[int] = []
    for enc in tokenizer.backend_tokenizer.encode_batch([d.text for d in docs]):
        ids.extend(enc.ids)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.long)


@dataclass
class TrainMetrics:
    """What one training run reports."""

    params_millions: float
    vocab_size: int
    train_docs: int
    heldout_docs: int
    train_tokens: int
    heldout_tokens_evaluated: int
    steps: int
    tokens_seen: int
    train_seconds: float
    tokens_per_second: float
    final_train_loss: float
    heldout_loss: float
    heldout_perplexity: float
    seq_len: int
    device: str


def _lr_at(step: int, frac_done: float, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac_done, 1.0))))


@torch.no_grad()
def heldout_loss(model, stream: torch.Tensor, seq_len: int, max_tokens: int, device: str) -> tuple[float, int]:
    """Mean next-token loss on non-overlapping ``seq_len`` windows of the held-out stream."""
    model.eval()
    n = min(len(stream), max_tokens) // seq_len
    total, count = 0.0, 0
    for i in range(n):
        x = stream[i * seq_len : (i + 1) * seq_len].unsqueeze(0).to(device)
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=device == "cuda"):
            out = model(input_ids=x, labels=x)
        total += float(out.loss) * (seq_len - 1)
        count += seq_len - 1
    model.train()
    return total / max(count, 1), count


def train(
    out_dir: Path,
    *,
    shape: ModelShape,
    vocab_size: int,
    seq_len: int,
    batch_size: int,
    train_seconds: float,
    max_corpus_bytes: int,
    heldout_percent: int,
    lr: float,
    device: str,
    seed: int = 0,
) -> TrainMetrics:
    """Build corpus and tokenizer, train for ``train_seconds`` of wall time, evaluate, save under ``out_dir``."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    t0 = time.perf_counter()
    train_docs, heldout_docs = collect_corpus(max_corpus_bytes, heldout_percent)
    if not train_docs or not heldout_docs:
        raise SystemExit(f"corpus too small: {len(train_docs)} train / {len(heldout_docs)} held-out documents")
    print(
        f"[train] corpus: {len(train_docs)} train / {len(heldout_docs)} held-out docs ({time.perf_counter() - t0:.1f}s)"
    )
    tokenizer = train_tokenizer([d.text for d in train_docs], vocab_size)
    train_ids = token_stream(tokenizer, train_docs)
    heldout_ids = token_stream(tokenizer, heldout_docs)
    print(f"[train] tokenizer + encode: {len(train_ids)} train tokens ({time.perf_counter() - t0:.1f}s)")

    config = llama_config(shape, len(tokenizer))
    model = LlamaForCausalLM(config).to(device)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1, fused=device == "cuda")
    n_windows = (len(train_ids) - 1) // seq_len
    gen = torch.Generator().manual_seed(seed)
    model.train()
    step, loss_ema = 0, float("nan")
    start = time.perf_counter()
    while True:
        elapsed = time.perf_counter() - start
        if elapsed >= train_seconds:
            break
        for g in opt.param_groups:
            g["lr"] = _lr_at(step, elapsed / train_seconds, lr, warmup=min(100, max(1, int(train_seconds))))
        idx = torch.randint(0, n_windows, (batch_size,), generator=gen) * seq_len
        x = torch.stack([train_ids[i : i + seq_len] for i in idx.tolist()]).to(device, non_blocking=True)
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=device == "cuda"):
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        if step % 50 == 0 or step == 1:
            value = float(loss.detach())
            loss_ema = value if math.isnan(loss_ema) else 0.9 * loss_ema + 0.1 * value
            print(f"[train] step {step} loss {value:.3f} ({time.perf_counter() - start:.0f}s)")
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    final_loss = float(loss.detach()) if step else float("nan")
    h_loss, h_tokens = heldout_loss(model, heldout_ids, seq_len, max_tokens=400_000, device=device)
    metrics = TrainMetrics(
        params_millions=params / 1e6,
        vocab_size=len(tokenizer),
        train_docs=len(train_docs),
        heldout_docs=len(heldout_docs),
        train_tokens=len(train_ids),
        heldout_tokens_evaluated=h_tokens,
        steps=step,
        tokens_seen=step * batch_size * seq_len,
        train_seconds=seconds,
        tokens_per_second=step * batch_size * seq_len / max(seconds, 1e-9),
        final_train_loss=final_loss,
        heldout_loss=h_loss,
        heldout_perplexity=math.exp(h_loss),
        seq_len=seq_len,
        device=device,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(out_dir / "model")
    tokenizer.save_pretrained(out_dir / "model")
    with open(out_dir / "heldout.jsonl", "w") as f:
        for d in heldout_docs:
            f.write(json.dumps({"path": d.path, "text": d.text}) + "\n")
    (out_dir / "train_metrics.json").write_text(json.dumps(asdict(metrics), indent=2))
    print(f"[train] {json.dumps(asdict(metrics))}")
    return metrics


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Training flags (shared with ``run_engine_bench.py``)."""
    parser.add_argument("--out-dir", type=Path, default=Path("/tmp/semblend-llama"))
    parser.add_argument("--train-seconds", type=float, default=200.0)
    parser.add_argument("--vocab-size", type=int, default=16384)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-corpus-mb", type=float, default=80.0)
    parser.add_argument("--heldout-percent", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--rope-theta", type=float, default=500_000.0)
    parser.add_argument("--rope-scaling-factor", type=float, default=8.0, help="llama3 scaling factor (<=1: none)")
    parser.add_argument("--tiny", action="store_true", help="a tiny model and corpus (CPU smoke runs)")


def shape_from_args(args: argparse.Namespace) -> ModelShape:
    """The model shape the flags ask for."""
    if args.tiny:
        return ModelShape(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            intermediate_size=128,
            rope_theta=args.rope_theta,
            rope_scaling_factor=args.rope_scaling_factor,
            rope_original_max_positions=256,
        )
    return ModelShape(rope_theta=args.rope_theta, rope_scaling_factor=args.rope_scaling_factor)


def train_from_args(args: argparse.Namespace) -> TrainMetrics:
    """Run :func:`train` with the parsed flags."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return train(
        args.out_dir,
        shape=shape_from_args(args),
        vocab_size=args.vocab_size,
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        train_seconds=args.train_seconds,
        max_corpus_bytes=int(args.max_corpus_mb * 1e6),
        heldout_percent=args.heldout_percent,
        lr=args.lr,
        device=device,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    train_from_args(parser.parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
