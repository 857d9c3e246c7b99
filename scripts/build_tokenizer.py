#!/usr/bin/env python3
"""Build the bundled text corpus and the bundled tokenizer (run once by a maintainer; outputs are committed).

Two steps, both deterministic:

``corpus``     extracts module, class and function docstrings of the 44 CPython standard library modules with the
               most docstring prose (this interpreter's stdlib, PSF License 2.0) into ``semblend_dynamo/data/corpus/<doc_id>.txt`` plus ``INDEX.json``.
``tokenizer``  trains a Qwen2-style byte-level BPE (8K vocab) on that corpus with the ``tokenizers`` library and
               writes ``semblend_dynamo/data/tokenizer.json``.

Usage: ``.venv/bin/python scripts/build_tokenizer.py [corpus|tokenizer|all]`` (default ``all``).
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import re
import sysconfig
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent.parent / "semblend_dynamo" / "data"
CORPUS_DIR = DATA_DIR / "corpus"
TOKENIZER_PATH = DATA_DIR / "tokenizer.json"

# Stdlib trees left out: tests, GUI demos, vendored or deprecated packages.
SKIP_TOP = (
    "test",
    "idlelib",
    "lib2to3",
    "tkinter",
    "turtledemo",
    "site-packages",
    "ensurepip",
    "distutils",
    "encodings",
)
N_DOCUMENTS = 44
MIN_WORDS = 800
MAX_WORDS = 1200
VOCAB_SIZE = 8192


def _sections(tree: ast.Module) -> list[tuple[str, str]]:
    """(heading, docstring) pairs in source order: the module, then every class, function and method."""
    out: list[tuple[str, str]] = []
    doc = ast.get_docstring(tree, clean=True)
    if doc:
        out.append(("", doc))
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            if node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node, clean=True)
            if doc and len(doc.split()) >= 12:
                out.append((node.name, doc))
    return out


def _document(path: Path) -> str:
    """The module's docstrings as one plain-text document, cut at MAX_WORDS on a section boundary."""
    parts: list[str] = []
    words = 0
    for heading, doc in _sections(ast.parse(path.read_text(encoding="utf-8"))):
        text = re.sub(r"\n{3,}", "\n\n", inspect.cleandoc(doc))
        block = f"{heading}\n\n{text}" if heading else text
        n = len(block.split())
        if words + n > MAX_WORDS:
            break
        parts.append(block)
        words += n
    return "\n\n".join(parts) + "\n" if parts else ""


def _candidates(stdlib: Path) -> list[tuple[str, str]]:
    """(module path without .py, document) for the N_DOCUMENTS stdlib modules with the most docstring prose."""
    scored: list[tuple[int, str, str]] = []
    for path in sorted(stdlib.rglob("*.py")):
        rel = path.relative_to(stdlib)
        if rel.parts[0] in SKIP_TOP or "test" in rel.as_posix():
            continue
        try:
            text = _document(path)
        except (SyntaxError, UnicodeDecodeError):
            continue
        words = len(text.split())
        if words >= MIN_WORDS:
            scored.append((-words, rel.with_suffix("").as_posix(), text))
    scored.sort()
    return sorted((module, text) for _, module, text in scored[:N_DOCUMENTS])


def build_corpus() -> None:
    """Write one .txt per module plus INDEX.json (doc id, title, source, words)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    CORPUS_DIR.mkdir(parents=True, exist_ok=True)
    for old in CORPUS_DIR.glob("*.txt"):
        old.unlink()
    index = []
    for module, text in _candidates(stdlib):
        dotted = module.removesuffix("/__init__").replace("/", ".")
        doc_id = re.sub(r"_+", "_", dotted.replace(".", "_")).strip("_")
        (CORPUS_DIR / f"{doc_id}.txt").write_text(text, encoding="utf-8")
        index.append(
            {"doc_id": doc_id, "title": f"Python {dotted} module", "source": f"cpython/Lib/{module}.py",
             "words": len(text.split())}
        )  # fmt: skip
    meta = {
        "description": "Docstrings of the CPython 3.11 standard library, one document per module.",
        "license": "Python Software Foundation License Version 2 (CPython source)",
        "built_by": "scripts/build_tokenizer.py corpus",
        "documents": index,
    }
    (CORPUS_DIR / "INDEX.json").write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    total = sum((CORPUS_DIR / f"{d['doc_id']}.txt").stat().st_size for d in index)
    print(f"corpus: {len(index)} documents, {total / 1024:.0f} KiB in {CORPUS_DIR}")


def build_tokenizer() -> None:
    """Train the byte-level BPE on the corpus files (sorted, so the result is reproducible)."""
    from semblend_dynamo.tokenizer import train_byte_level_bpe

    lines: list[str] = []
    for path in sorted(CORPUS_DIR.glob("*.txt")):
        lines.extend(path.read_text(encoding="utf-8").splitlines(keepends=True))
    tok = train_byte_level_bpe(lines, VOCAB_SIZE)
    tok.save(str(TOKENIZER_PATH))
    print(f"tokenizer: vocab {tok.get_vocab_size()} -> {TOKENIZER_PATH}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("step", nargs="?", choices=("corpus", "tokenizer", "all"), default="all")
    step = parser.parse_args().step
    if step in ("corpus", "all"):
        build_corpus()
    if step in ("tokenizer", "all"):
        build_tokenizer()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
