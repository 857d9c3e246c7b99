"""The repository stands alone: no file cites documents outside it."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_no_file_cites_documents_outside_the_repo() -> None:
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    outside = ("DESIGN" + ".md", "../" + "shared/", "shared/" + "reference", "deps" + ".md")  # split: not a citation
    hits = [
        f"{name}: {needle}"
        for name in files
        if (REPO / name).is_file() and (REPO / name).suffix in {".py", ".md", ".yaml", ".json", ".sh", ".tpl", ".toml"}
        for needle in outside
        if needle in (REPO / name).read_text(errors="ignore")
    ]
    assert hits == []
