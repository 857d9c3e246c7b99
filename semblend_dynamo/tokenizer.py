"""Tokenizer adapter over any Hugging Face ``tokenizer.json``.

The bundled tokenizer (``semblend_dynamo/data/tokenizer.json``) is a Qwen2-style byte-level BPE trained by
``scripts/build_tokenizer.py`` on the bundled corpus, so tests and replay never download a tokenizer. A served
model's own ``tokenizer.json`` plugs in the same way (``SEMBLEND_TOKENIZER``). The fingerprint is part of the
:class:`~semblend_dynamo.namespace.NamespaceKey`: token ids from two different tokenizers never meet.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokenizers import Tokenizer


QWEN2_SPLIT_PATTERN = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
"""Qwen2's pre-tokenizer split (the Qwen2 tokenizer.json's pre_tokenizer)."""
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def train_byte_level_bpe(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """A Qwen2-style byte-level BPE (NFC, Qwen2 split, ByteLevel) trained on ``texts`` with ``tokenizers``.

    Deterministic for the same texts in the same order. Used for the bundled tokenizer and by the
    engine-in-the-loop benchmark, which trains its own on the GPU machine's corpus.
    """
    from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from tokenizers import Tokenizer as HFTokenizer

    tok = HFTokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


class TokenizerError(ValueError):
    """A tokenizer file is missing or unreadable, or token ids are out of range."""


def fingerprint_file(path: str) -> str:
    """BLAKE2b fingerprint of a file (e.g. a ``tokenizer.json``), used as the tokenizer fingerprint."""
    h = hashlib.blake2b(digest_size=8)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def tokenizer_fingerprint(path: str | None) -> str:
    """The fingerprint of the tokenizer a deployment uses (``SEMBLEND_TOKENIZER``, else the bundled one)."""
    return fingerprint_file(str(path) if path else str(bundled_tokenizer_path()))


def bundled_tokenizer_path() -> Path:
    """Path of the tokenizer.json that ships with the package."""
    return Path(str(resources.files("semblend_dynamo") / "data" / "tokenizer.json"))


class TokenizerAdapter:
    """Encode/decode text with one ``tokenizer.json``; no special tokens are added or stripped."""

    def __init__(self, tokenizer: Tokenizer, *, path: Path, fingerprint: str) -> None:
        self._tok = tokenizer
        self.path = path
        self.fingerprint = fingerprint
        self.vocab_size: int = tokenizer.get_vocab_size(with_added_tokens=True)

    @classmethod
    def from_file(cls, path: str | Path) -> TokenizerAdapter:
        """Load ``path``; raises :class:`TokenizerError` naming the file when it is missing or corrupt."""
        try:
            from tokenizers import Tokenizer as HFTokenizer
        except ImportError as exc:  # the base install has no tokenizers
            raise TokenizerError(
                "the 'tokenizers' package is required: pip install 'semblend-dynamo[embedder]'"
            ) from exc
        path = Path(path)
        if not path.is_file():
            raise TokenizerError(f"tokenizer file {str(path)!r} does not exist")
        try:
            tok = HFTokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception for malformed JSON
            raise TokenizerError(f"tokenizer file {str(path)!r} is not a valid tokenizer.json: {exc}") from None
        # Some files (e.g. sentence-transformers') configure padding/truncation; prompts need the raw ids.
        tok.no_padding()
        tok.no_truncation()
        return cls(tok, path=path, fingerprint=fingerprint_file(str(path)))

    @classmethod
    def bundled(cls) -> TokenizerAdapter:
        """The tokenizer that ships with the package (8K byte-level BPE)."""
        return cls.from_file(bundled_tokenizer_path())

    @classmethod
    def from_config(cls, tokenizer_path: str | None) -> TokenizerAdapter:
        """``SemblendConfig.tokenizer``: a path, or None for the bundled tokenizer."""
        return cls.from_file(tokenizer_path) if tokenizer_path else cls.bundled()

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (empty text -> [])."""
        if not text:
            return []
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of several texts (parallel inside the tokenizers library)."""
        encodings = self._tok.encode_batch(list(texts), add_special_tokens=False)
        return [list(e.ids) for e in encodings]

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``; raises :class:`TokenizerError` for ids outside the vocabulary."""
        bad = [i for i in ids if not 0 <= int(i) < self.vocab_size]
        if bad:
            raise TokenizerError(f"token ids out of range [0, {self.vocab_size}): {bad[:5]}")
        return str(self._tok.decode([int(i) for i in ids], skip_special_tokens=False))

    def __repr__(self) -> str:
        return (
            f"TokenizerAdapter(path={str(self.path)!r}, vocab_size={self.vocab_size}, fingerprint={self.fingerprint})"
        )
